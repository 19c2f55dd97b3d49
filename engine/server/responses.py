"""The answers: a whole completion as one JSON body, or a stream of server-sent events
(`data: {json}`, ending in `data: [DONE]`) in OpenAI's chunk structure: the first delta carries
the role, one id across chunks, the last choice chunk a finish_reason and no content, then, with
include_usage, one chunk with empty choices and the usage (every other chunk `usage: null`).
"""

from __future__ import annotations

import asyncio
import codecs
import json
import time
from collections.abc import AsyncIterator

from engine.answer.parts import CallStart, Content, Reasoning
from engine.answer.reader import Reading, read_whole
from engine.events import Failed, Finished, Token
from engine.server.bridge import ServedGeneration
from engine.server.errors import APIError, error_body

# a loop cut short (the stop_on_repetition extension) is "stop", not "length": a client that
# reads "length" as "ask for more" would ask the model to go on repeating itself
FINISH_REASONS = {"eos": "stop", "stop_string": "stop", "max_tokens": "length",
                  "repetition": "stop"}
STOPPING = "the server is stopping; the request was cancelled"
_MARK = "\x00hearth-text\x00"  # stands for a token's text in a chunk's template
_MARK_JSON = json.dumps(_MARK)


class Shape:
    """Chat (`delta` / `message`) or text completion (`text`) bodies of one request."""

    def __init__(self, chat: bool, gen: ServedGeneration, model: str, num_per_prompt: int,
                 view=None):
        self.chat, self.gen, self.model, self.view = chat, gen, model, view  # view: ModelView
        self.created = int(time.time())
        self.prompt_tokens = sum(c.prompt_tokens for c in gen.choices) // max(num_per_prompt, 1)
        self.completion_tokens = 0
        self._text_sse: dict[int, tuple[str, str]] = {}  # by choice: the bytes around the text
        self._logprobs: dict[int, list[dict]] = {}  # by choice: the parts of a whole answer's
        self._chars: dict[int, tuple[int, object]] = {}  # by choice: text_offset's count so far

    def usage(self) -> dict:
        return {"prompt_tokens": self.prompt_tokens, "completion_tokens": self.completion_tokens,
                "total_tokens": self.prompt_tokens + self.completion_tokens}

    def _envelope(self, choices: list[dict], usage=None, chunk: bool = False) -> dict:
        kind = ("chat.completion.chunk" if chunk else "chat.completion") if self.chat else \
            "text_completion"
        return {"id": self.gen.id, "object": kind, "created": self.created, "model": self.model,
                "system_fingerprint": None, "choices": choices, "usage": usage}

    def chunk(self, index: int, text: str | None = None, role: bool = False,
              finish: str | None = None, logprobs: dict | None = None,
              delta: dict | None = None) -> dict:
        if self.chat:
            delta = delta if delta is not None else {"role": "assistant", "content": ""} if \
                role else ({"content": text} if text is not None else {})
            choice = {"index": index, "delta": delta, "logprobs": logprobs,
                      "finish_reason": finish}
        else:
            choice = {"index": index, "text": text or "", "logprobs": logprobs,
                      "finish_reason": finish}
        return self._envelope([choice], chunk=True)

    async def logprobs(self, index: int, event: Token) -> dict:
        """A Token event's logprobs in this API's shape: chat's {"content": [{token, logprob,
        bytes, top_logprobs}]}, or completions' tokens, token_logprobs, top_logprobs and
        text_offset (characters into this choice's text)."""
        wanted = list(dict.fromkeys(i for tid, (_, top) in zip(event.token_ids, event.logprobs,
                                                               strict=True)
                                    for i in (tid, *(t for t, _ in top))))
        pieces = dict(zip(wanted, await self.view.run(self.view.token_pieces, wanted),
                          strict=True))
        if self.chat:
            def entry(token_id: int, logprob: float) -> dict:
                return {"token": pieces[token_id][0], "logprob": logprob,
                        "bytes": pieces[token_id][1]}
            return {"content": [{**entry(tid, lp), "top_logprobs": [entry(*t) for t in top]}
                                for tid, (lp, top) in zip(event.token_ids, event.logprobs,
                                                          strict=True)], "refusal": None}
        chars, decoder = self._chars.get(index) or (
            0, codecs.getincrementaldecoder("utf-8")("replace"))
        offsets = []
        for tid in event.token_ids:  # where each token starts in the text, a partial character
            offsets.append(chars)  # counted where it ends
            chars += len(decoder.decode(bytes(pieces[tid][1])))
        self._chars[index] = (chars, decoder)
        return {"tokens": [pieces[tid][0] for tid in event.token_ids],
                "token_logprobs": [lp for lp, _ in event.logprobs],
                "top_logprobs": [{pieces[t][0]: lp for t, lp in top} for _, top in event.logprobs],
                "text_offset": offsets}

    def keep_logprobs(self, index: int, part: dict) -> None:
        """A part of a whole answer's logprobs (`logprobs`' answer), in order."""
        self._logprobs.setdefault(index, []).append(part)

    def _whole_logprobs(self, index: int) -> dict | None:
        parts = self._logprobs.get(index)
        if parts is None:
            return None
        if self.chat:
            return {"content": [e for p in parts for e in p["content"]], "refusal": None}
        return {key: [v for p in parts for v in p[key]] for key in
                ("tokens", "token_logprobs", "top_logprobs", "text_offset")}

    def text_sse(self, index: int, text: str) -> str:
        """`_sse(self.chunk(index, text))`, the same characters, without building and encoding
        the envelope per token: the server sends thousands of these a second on the thread
        that the engine's step needs back."""
        around = self._text_sse.get(index)
        if around is None:
            line = _sse(self.chunk(index, _MARK))
            head, sep, tail = line.partition(_MARK_JSON)
            around = self._text_sse[index] = (head, tail) if sep and _MARK_JSON not in tail \
                else None
        if around is None:  # the mark is not where the text goes: the slow, sure way
            return _sse(self.chunk(index, text))
        return around[0] + json.dumps(text, ensure_ascii=False) + around[1]

    def whole(self, texts: dict[int, str], finishes: dict[int, str]) -> dict:
        choices = []
        readings = {c.index: c.reading for c in self.gen.choices}
        for i in sorted(texts):
            if self.chat:
                message, finish = chat_message(readings[i], texts[i], finishes[i])
                choices.append({"index": i, "message": message,
                                "logprobs": self._whole_logprobs(i), "finish_reason": finish})
            else:
                choices.append({"index": i, "text": texts[i], "logprobs": self._whole_logprobs(i),
                                "finish_reason": finishes[i]})
        return self._envelope(choices, self.usage())


def start(state, choices, prefix: str, model_name: str, chat: bool = True,
          num_per_prompt: int = 1) -> Shape:
    """Submit a request's choices to the app's engine (`app.state`) -> the Shape its answer is
    read through."""
    gen = ServedGeneration(state.engine, choices, state.metrics, prefix, state.mailbox)
    gen.start()
    return Shape(chat, gen, model_name, num_per_prompt, state.model)


def chat_message(reading: Reading, text: str, finish: str) -> tuple[dict, str]:
    """A whole chat answer's message and finish_reason: the text read into content, reasoning
    and tool calls (engine/answer); an answer without the call tool_choice asked is a 422."""
    if reading.is_plain:
        return {"role": "assistant", "content": text, "refusal": None}, finish
    message, missing = read_whole(reading, text)
    if missing is not None:
        raise APIError(422, missing, "tool_choice", "tool_call_missing")
    out = {"role": "assistant", "content": message.content or (None if message.calls else ""),
           "refusal": None}
    if reading.thinks:
        out["reasoning_content"] = message.reasoning or None
    if message.calls:
        out["tool_calls"] = message.calls
    return out, "tool_calls" if message.calls and finish == "stop" else finish


def _delta(part) -> dict:
    """One part of an answer as a chat chunk's delta, in OpenAI's shape."""
    if isinstance(part, Content):
        return {"content": part.text}
    if isinstance(part, Reasoning):
        return {"reasoning_content": part.text}
    if isinstance(part, CallStart):
        return {"tool_calls": [{"index": part.index, "id": part.id, "type": "function",
                                "function": {"name": part.name, "arguments": ""}}]}
    return {"tool_calls": [{"index": part.index, "function": {"arguments": part.text}}]}


def _sse(obj) -> str:
    text = obj if isinstance(obj, str) else json.dumps(obj, ensure_ascii=False)
    return f"data: {text}\n\n"


def _failure(event, gen: ServedGeneration) -> APIError:
    if isinstance(event, Failed):
        message = event.error + (f" ({event.hint})" if event.hint else "")
        return APIError(400 if event.bad_input else 500, message)
    # cancelled: for its client's sake (it left, it read too slowly), else by a stop
    return gen.ended_why or APIError(503, STOPPING, code="cancelled")


async def stream(shape: Shape, request, include_usage: bool) -> AsyncIterator[str]:
    gen = shape.gen
    watcher = asyncio.create_task(gen.watch_disconnect(request))
    # a reader per chat choice whose text is more than content (calls, thinking)
    readers = {c.index: c.reading.reader() for c in gen.choices
               if shape.chat and not c.reading.is_plain}
    try:
        if shape.chat:
            for c in gen.choices:
                yield _sse(shape.chunk(c.index, role=True))
        while not gen.done:
            index, event = await gen.next()
            reader = readers.get(index)
            if isinstance(event, Token) and event.logprobs and reader is None:
                yield _sse(shape.chunk(index, event.text,
                                       logprobs=await shape.logprobs(index, event)))
            elif isinstance(event, Token) and event.text and reader is None:
                yield shape.text_sse(index, event.text)
            elif isinstance(event, Token) and event.text:
                for part in reader.feed(event.text):
                    yield _sse(shape.chunk(index, delta=_delta(part)))
            elif isinstance(event, Finished) and event.reason in FINISH_REASONS:
                shape.completion_tokens += event.stats.new_tokens
                finish = FINISH_REASONS[event.reason]
                if reader is not None:
                    held = reader.finish()
                    missing = reader.missing_call()
                    if missing is not None:  # and the prose held back is not sent
                        yield _sse(error_body(422, missing, "tool_choice", "tool_call_missing"))
                        gen.close()
                        yield _sse("[DONE]")
                        return
                    for part in held:
                        yield _sse(shape.chunk(index, delta=_delta(part)))
                    finish = "tool_calls" if reader.called and finish == "stop" else finish
                yield _sse(shape.chunk(index, finish=finish))
            elif isinstance(event, (Finished, Failed)):  # a failure, or stopped by the server
                e = _failure(event, gen)
                yield _sse(error_body(e.status, e.message, e.param, e.code))
                gen.close()
                yield _sse("[DONE]")
                return
        if include_usage:
            yield _sse(shape._envelope([], shape.usage(), chunk=True))
        yield _sse("[DONE]")
    finally:
        watcher.cancel()
        gen.close()


async def collect(shape: Shape, request) -> dict:
    gen = shape.gen
    watcher = asyncio.create_task(gen.watch_disconnect(request))
    texts = {c.index: [] for c in gen.choices}
    finishes: dict[int, str] = {}
    try:
        while not gen.done:
            index, event = await gen.next()
            if isinstance(event, Token):
                texts[index].append(event.text)
                if event.logprobs:
                    shape.keep_logprobs(index, await shape.logprobs(index, event))
            elif isinstance(event, Finished) and event.reason in FINISH_REASONS:
                shape.completion_tokens += event.stats.new_tokens
                finishes[index] = FINISH_REASONS[event.reason]
            elif isinstance(event, (Finished, Failed)):
                raise _failure(event, gen)
    finally:
        watcher.cancel()
        gen.close()
    return shape.whole({i: "".join(t) for i, t in texts.items()}, finishes)
