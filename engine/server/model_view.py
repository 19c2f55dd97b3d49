"""What the server knows of the loaded model: the ids clients may call it by, its context and
vocabulary, and a tokenizer of its own that turns prompts into ids exactly as `hearth run` does.

The tokenizer is a copy used on one thread of its own: the engine thread decodes with the
session's while requests are tokenized here, and a Rust tokenizer is not shared across threads.
"""

from __future__ import annotations

import asyncio
import copy
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from engine.answer.reasoning import thinks
from engine.answer.tool_syntax import syntax_for
from engine.events import BadRequest
from engine.generate import template_guard
from engine.generate.prompt import Splice, render_template, template_text
from engine.generate.template_guard import RenderBudget
from engine.grammar import compiled
from engine.server.errors import APIError

MAX_RENDERS = 4  # chat templates rendering at once, each in a child process of its own
# fill-in-the-middle markers by family, prefix/suffix/middle: a `suffix` needs one of these sets
FIM_TOKENS = (("<|fim_prefix|>", "<|fim_suffix|>", "<|fim_middle|>"),  # Qwen2.5-Coder
              ("<fim_prefix>", "<fim_suffix>", "<fim_middle>"),  # StarCoder, SantaCoder
              ("<PRE>", "<SUF>", "<MID>"))  # Code Llama


def gpt2_byte_chars() -> dict[int, str]:
    """Byte-level BPE's table (GPT-2's): every byte as the printable character that stands for
    it in the vocabulary's tokens."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1),
                 *range(ord("®"), ord("ÿ") + 1)]
    chars, extra = {}, 0
    for b in range(256):
        if b in printable:
            chars[b] = chr(b)
        else:
            chars[b], extra = chr(256 + extra), extra + 1
    return chars


def model_ids(given: str | None, folder: Path) -> tuple[str, ...]:
    """The listed id first (the folder's name, or a Hugging Face repo id as given), then every
    other name a client may use: the path as given to --model, and the folder's full path."""
    listed = folder.name
    if given is not None and not Path(given).expanduser().exists():
        listed = given  # a repo id: its folder is a snapshot hash in the Hub cache
    names = [listed, *([given] if given else []), str(folder)]
    return tuple(dict.fromkeys(names))


class ModelView:
    def __init__(self, tokenizer, context: int, vocab_size: int, ids: tuple[str, ...]):
        self.tok = copy.deepcopy(tokenizer)
        self.context, self.vocab_size, self.ids = context, vocab_size, ids
        self._thread = ThreadPoolExecutor(1, thread_name_prefix="hearth-tokenize")
        self._renders = ThreadPoolExecutor(MAX_RENDERS, thread_name_prefix="hearth-render")
        self._byte_of: dict[str, int] | None = None  # byte-level BPE's character -> its byte
        template = template_text(self.tok)
        # how answers are read, from what the template writes: its family's call syntax, and
        # whether it thinks; named in /v1/models
        self.tool_syntax, self.thinks = syntax_for(template), thinks(template)
        self.renders_calls = "tool_calls" in (template or "")  # else calls go in as text
        if getattr(self.tok, "chat_template", None):
            template_guard.prewarm()
        # the grammar engine's view of the vocabulary (a second or two on a large one) is built
        # now, on the tokenizer's thread, not by the first constrained request
        self.grammar_ready = self._thread.submit(self._grammar_tokenizer)

    def _grammar_tokenizer(self) -> bool:
        try:
            compiled.tokenizer_for(self.tok, self.vocab_size)
        except ValueError:  # a slow tokenizer: a grammar is refused when one is asked for
            return False
        return True

    @classmethod
    def of(cls, session, given: str | None) -> ModelView:
        lm = session.lm
        return cls(lm.tokenizer, lm.context, lm.model.config.vocab_size,
                   model_ids(given, Path(lm.folder.path)))

    @property
    def id(self) -> str:
        return self.ids[0]

    def knows(self, model: str) -> bool:
        return model in self.ids

    def require(self, name: str) -> None:
        """A 404 for a model this server does not serve."""
        if not self.knows(name):
            raise APIError(404, f"The model {name[:200]!r} does not exist; this server serves "
                           f"{self.id!r}", "model", "model_not_found")

    async def run(self, fn, *args):
        """`fn(*args)` on the tokenizer's thread, so the event loop keeps serving."""
        return await asyncio.get_running_loop().run_in_executor(self._thread, fn, *args)

    async def chat_ids(self, messages: list[dict], extra: dict | None = None) -> list[int]:
        """generate/prompt.py's tokenization of a chat with nothing cached: the same ids."""
        return (await self.chat_prompt(messages, extra))[0]

    async def chat_prompt(self, messages: list[dict],
                          extra: dict | None = None) -> tuple[list[int], str]:
        """The chat's ids and the text they were read from. The template renders on a thread of
        the renders' own, waiting on its child process: a costly one holds up neither the event
        loop nor other requests' tokenizing. `extra`: `tools`, a template's own kwargs."""
        if not getattr(self.tok, "chat_template", None):
            raise BadRequest("this model has no chat template; send a raw prompt to "
                             "/v1/completions instead")
        text = await asyncio.get_running_loop().run_in_executor(
            self._renders, render_template, self.tok, messages, RenderBudget(None), extra)
        return await self.run(Splice(self.tok, []).tokenize, text), text

    def text_ids(self, text: str) -> list[int]:
        """`hearth run --raw`'s tokenization: the tokenizer's default, special tokens added."""
        return list(self.tok(text)["input_ids"])

    def token_pieces(self, ids: list[int]) -> list[tuple[str, list[int]]]:
        """Each token as (its text, its bytes), on the tokenizer's thread: a byte-level BPE
        token's own bytes (part of a character, perhaps), else the bytes of its decoded text."""
        if self._byte_of is None:
            byte_level = type(self.tok.backend_tokenizer.decoder).__name__ == "ByteLevel" \
                if getattr(self.tok, "backend_tokenizer", None) is not None else False
            self._byte_of = {c: b for b, c in gpt2_byte_chars().items()} if byte_level else {}
        out = []
        for token_id, piece in zip(ids, self.tok.convert_ids_to_tokens(ids), strict=True):
            if self._byte_of and all(c in self._byte_of for c in piece):
                raw = bytes(self._byte_of[c] for c in piece)
            else:
                raw = self.tok.decode([token_id]).encode()
            out.append((raw.decode("utf-8", "replace"), list(raw)))
        return out

    def fim_tokens(self) -> tuple[str, str, str] | None:
        vocab = self.tok.get_vocab()
        return next((t for t in FIM_TOKENS if all(x in vocab for x in t)), None)

    def close(self) -> None:
        self._thread.shutdown(wait=False, cancel_futures=True)
        self._renders.shutdown(wait=False, cancel_futures=True)
