"""A request's prompt as token ids: the chat template, earlier answers kept as the ids the model
generated, and the oldest turns left out when the conversation outgrows the context.

Pure tokenizer work on the host (no torch): where the ids' K/V come from is generate/session.py's
business.
"""

from __future__ import annotations

import threading
from typing import NamedTuple

from engine.events import BadRequest, GenerateRequest
from engine.generate import template_guard
from engine.generate.template_guard import (
    RenderBudget,
    RenderCancelled,
    RenderFailed,
    RenderTooCostly,
)


class Prompt(NamedTuple):
    ids: list[int]
    dropped_messages: int  # oldest messages after the system prompt left out to fit the context


def build(tok, req: GenerateRequest, history: list[int], context: int,
          cancel: threading.Event | None = None) -> Prompt:
    """The ids to prefill for `req`; `history` is what the cache holds (the last prompt and its
    answer), whose ids are kept where the rendered text repeats them (see `tokenize`).

    The chat template renders under a RenderBudget: a hostile one fails as bad input, and a
    cancel stops it (RenderCancelled)."""
    if req.prompt_ids is not None:
        return Prompt(list(req.prompt_ids), 0)
    if req.raw:
        return Prompt(list(tok(req.prompt)["input_ids"]), 0)
    messages = list(req.messages or [{"role": "user", "content": req.prompt}])
    if req.system is not None:
        messages.insert(0, {"role": "system", "content": req.system})
    if not getattr(tok, "chat_template", None):
        raise BadRequest("this model has no chat template; use --raw to send the prompt as is")
    splice = Splice(tok, history)
    budget = RenderBudget(cancel)
    render = lambda msgs: splice.tokenize(render_template(tok, msgs, budget))
    ids = render(messages)
    # room for the answer too; but a max_new_tokens near the context would leave out every turn
    limit = context - min(req.max_new_tokens, context // 2)
    if len(ids) <= limit:
        return Prompt(ids, 0)
    num_system = next((i for i, m in enumerate(messages) if m["role"] != "system"),
                      len(messages))
    system, body = messages[:num_system], messages[num_system:]
    # a turn starts at a user message; the last turn (the question being answered) always stays
    starts = [i for i, m in enumerate(body) if i == 0 or m["role"] == "user"]
    # fewest turns dropped that fit: lengths fall as turns go, so bisect over how many
    lo, hi, best = 1, len(starts) - 1, None
    while lo <= hi:
        k = (lo + hi) // 2
        candidate = render(system + body[starts[k]:])
        if len(candidate) <= limit:
            best, hi = (candidate, k), k - 1
        else:
            lo = k + 1
    if best is None:  # only the last turn left; the session refuses it if even it cannot fit
        k = len(starts) - 1
        best = (render(system + body[starts[k]:]) if k > 0 else ids, k)
    return Prompt(best[0], starts[best[1]])


def render_template(tok, messages: list[dict], budget: RenderBudget,
                    extra: dict | None = None) -> str:
    """The chat template's text for `messages`, as `tok.apply_chat_template` gives it, rendered
    where it can be stopped (generate/template_guard.py); whatever goes wrong in the template
    (too slow, too long, blocked by the sandbox, raising, not parsing) is one BadRequest.
    `extra`: more of apply_chat_template's arguments (`tools`, a template's own kwargs)."""
    name = f"the chat template of {getattr(tok, 'name_or_path', '') or 'this model'}"
    try:
        template = tok.get_chat_template()
        kwargs = {**tok.special_tokens_map, **(extra or {})}
        return template_guard.render(template, messages, kwargs, budget)
    except RenderCancelled:
        raise
    except RenderTooCostly as e:
        raise BadRequest(f"{name} {e} and was stopped; the model folder's template is broken "
                         "or hostile") from None
    except (RenderFailed, ValueError) as e:  # ValueError: no template by that name
        kind, detail = e.args if isinstance(e, RenderFailed) else (type(e).__name__, str(e))
        detail = " ".join(detail.split())  # one line, whatever the template made of it
        detail = detail if len(detail) <= 300 else detail[:297] + "..."
        raise BadRequest(f"{name} failed: {kind}: {detail}") from None


class Splice:
    """Tokenizes a rendered prompt so that ids in `history` survive where its text repeats.

    Re-tokenizing an earlier answer's text can give other ids than the model generated (BPE does
    not round-trip every sequence), which changes what the model saw and defeats reuse. So: if
    the whole history decodes to a prefix of the text, keep it and tokenize only the rest;
    otherwise keep the longest piece of it that ends at a special token (<|im_end|>, ...) and
    decodes to a prefix. A special token splits the text before BPE runs, so the ids after such
    a point are the ones a from-scratch tokenization gives: only generated ids can differ.
    """

    def __init__(self, tok, history: list[int]):
        self.tok, self.history = tok, list(history)
        special = set(getattr(tok, "all_special_ids", ()))
        special |= set(getattr(tok, "added_tokens_decoder", {}) or {})
        # candidate cut points: just after each special token, and the whole history
        self.cuts = [i + 1 for i, t in enumerate(self.history) if t in special]
        if self.history and (not self.cuts or self.cuts[-1] != len(self.history)):
            self.cuts.append(len(self.history))
        self._texts: dict[int, str] = {}

    def _text(self, n: int) -> str:
        if n not in self._texts:
            self._texts[n] = self.tok.decode(self.history[:n], skip_special_tokens=False,
                                             clean_up_tokenization_spaces=False)
        return self._texts[n]

    def _keeps(self, text: str, n: int) -> bool:
        done = self._text(n)
        return bool(done) and text.startswith(done)

    def tokenize(self, text: str) -> list[int]:
        n = 0
        cuts = self.cuts
        if cuts and self._keeps(text, cuts[-1]):
            n = cuts[-1]
        else:
            # every cut but the last ends at a special token: the prefix property is monotone
            lo, hi = 0, len(cuts) - 2
            while lo <= hi:
                mid = (lo + hi) // 2
                if self._keeps(text, cuts[mid]):
                    n, lo = cuts[mid], mid + 1
                else:
                    hi = mid - 1
        rest = text[len(self._text(n)):] if n else text
        return self.history[:n] + list(self.tok(rest, add_special_tokens=False)["input_ids"])
