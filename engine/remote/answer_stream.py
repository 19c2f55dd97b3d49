"""OpenAI chat-completion chunks turned into Hearth's events (Token, Stats, then one Finished or
Failed), with time to first token and tokens per second measured from the stream. Pure: the
transport feeds it server events and the time; it never reads a socket."""

from __future__ import annotations

import json
import math

from engine.events import Failed, Finished, Stats, Token
from engine.remote.failures import scrub, server_message
from engine.remote.sse import ServerEvent

STATS_INTERVAL_S = 0.25  # Stats at most four times a second, as the local engine sends them
# OpenAI's finish reasons in Hearth's words; others (content_filter, tool_calls) end like eos
FINISH_REASONS = {"stop": "eos", "length": "max_tokens"}
KEPT = "The answer so far is kept; regenerate to try again."


class AnswerStream:
    def __init__(self, where: str, started_at: float, api_key: str | None = None,
                 max_deltas: int | None = None) -> None:
        self.where = where
        self.finish_reason: str | None = None  # OpenAI's, from the last chunk
        self.has_done = False  # `data: [DONE]` came
        self.failure: Failed | None = None  # an error chunk or a chunk that is not one
        self._api_key = api_key
        self._started_at = started_at
        self._first_at: float | None = None
        self._last_at = started_at
        self._num_deltas = 0
        self._usage: tuple[int, int] | None = None  # (prompt, completion) tokens, when sent
        self._is_reasoning = False
        self._last_stats_at = -math.inf
        # the answer's token limit: a server may send fewer deltas than tokens, never more
        self._max_deltas = max_deltas
        self._is_capped = False  # text came past the limit: the answer ends at it

    @property
    def is_over(self) -> bool:
        """Nothing after this can change the answer: stop reading."""
        return self.has_done or self.failure is not None or self._is_capped

    @property
    def num_deltas(self) -> int:
        return self._num_deltas

    def feed(self, event: ServerEvent, now: float) -> list:
        data = event.data.strip()
        if data == "[DONE]":
            self.has_done = True
            return []
        try:
            chunk = json.loads(data)
        except ValueError:
            chunk = None
        if not isinstance(chunk, dict):
            self.failure = Failed(f"The endpoint at {self.where} sent something that is not an "
                                  f"OpenAI chunk: {scrub(data[:80], self._api_key)!r}.", KEPT)
            return []
        if event.kind == "error" or "error" in chunk:
            said = scrub(server_message(data.encode()), self._api_key) or "no details"
            self.failure = Failed(f"The endpoint at {self.where} reported an error mid-answer: "
                                  f"{said.rstrip('.')}.", KEPT)
            return []
        usage = chunk.get("usage")
        if isinstance(usage, dict):
            prompt, completion = usage.get("prompt_tokens"), usage.get("completion_tokens")
            if type(prompt) is int and type(completion) is int:
                self._usage = (prompt, completion)
        events = []
        for choice in chunk.get("choices") or ():
            if not isinstance(choice, dict) or choice.get("index", 0) != 0:
                continue  # n > 1 is never asked for
            text = self._delta_text(choice.get("delta"))
            if text and self._max_deltas is not None and self._num_deltas >= self._max_deltas:
                self.finish_reason, self._is_capped = "length", True
                break
            if text:
                self._num_deltas += 1
                self._first_at = self._first_at if self._first_at is not None else now
                self._last_at = now
                events.append(Token(text, ()))
            if isinstance(choice.get("finish_reason"), str):
                self.finish_reason = choice["finish_reason"]
        if events and now - self._last_stats_at >= STATS_INTERVAL_S:
            self._last_stats_at = now
            events.append(self.stats())
        return events

    def refuse(self, why: str) -> None:
        """The stream broke a bound (`why` says how): the answer ends here, failed."""
        self.failure = Failed(f"The endpoint at {self.where} {why}; the answer stops there.",
                              KEPT)

    def end(self, is_cancelled: bool = False, cut_reason: str = "") -> list:
        """The events that close the stream: exactly one Finished or Failed, last.

        `cut_reason`: why reading stopped early (a reset, a timeout); "" for a clean end.
        """
        events: list = [Token("</think>", ())] if self._is_reasoning else []
        if self.failure is not None:
            events.append(self.failure)
        elif is_cancelled:
            events.append(Finished("cancelled", self.stats()))
        elif self.finish_reason is not None or (self.has_done and not cut_reason):
            events.append(Finished(FINISH_REASONS.get(self.finish_reason, "eos"), self.stats()))
        elif self._num_deltas:
            why = f" ({cut_reason})" if cut_reason else ""
            events.append(Failed(f"The connection to the endpoint at {self.where} was cut "
                                 f"mid-answer{why}.", KEPT))
        else:
            why = f" ({cut_reason})" if cut_reason else ""
            events.append(Failed(f"The endpoint at {self.where} closed the connection before "
                                 f"answering{why}.", "Try again; the server's log says more."))
        return events

    def stats(self) -> Stats:
        new_tokens = self._usage[1] if self._usage else self._num_deltas
        ttft_ms = (self._first_at - self._started_at) * 1000 if self._first_at is not None else 0.0
        span_s = self._last_at - self._first_at if self._first_at is not None else 0.0
        # the first token's time is TTFT's; the rest arrived over span_s
        rate = (new_tokens - 1) / span_s if new_tokens > 1 and span_s > 0 else 0.0
        prompt = self._usage[0] if self._usage else 0
        return Stats(prompt_tokens=prompt, new_tokens=new_tokens, ttft_ms=ttft_ms,
                     decode_tokens_per_s=rate,
                     context_used_tokens=prompt + new_tokens if self._usage else 0)

    def _delta_text(self, delta) -> str:
        """Content, with reasoning (vLLM's and DeepSeek's reasoning_content) in <think> tags:
        the chat shows it folded, as for a local reasoning model."""
        if not isinstance(delta, dict):
            return ""
        reasoning = delta.get("reasoning_content") or delta.get("reasoning")
        content = delta.get("content")
        text = ""
        if isinstance(reasoning, str) and reasoning:
            if not self._is_reasoning:
                text, self._is_reasoning = "<think>", True
            text += reasoning
        if isinstance(content, str) and content:
            if self._is_reasoning:
                text, self._is_reasoning = text + "</think>", False
            text += content
        return text
