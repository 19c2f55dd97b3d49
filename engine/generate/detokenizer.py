"""Incremental, byte-safe detokenization and stop strings.

A UTF-8 character may be split over several byte-level tokens: text is released only once the
decoded window no longer ends in U+FFFD, so a stream never shows half a character. Decoding a
short window (from `prefix` on) keeps each step O(1) instead of re-decoding the whole answer.
"""

from __future__ import annotations


class Detokenizer:
    def __init__(self, tokenizer, prompt_tail: list[int] | None = None):
        self.tokenizer = tokenizer
        # a few prompt tokens give the first answer token its left context (leading spaces)
        self.ids: list[int] = list(prompt_tail or [])[-4:]
        self.prefix = 0  # ids[prefix:read] is the window whose text was already released
        self.read = len(self.ids)

    def _decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=False,
                                     clean_up_tokenization_spaces=False)

    def add(self, token_id: int) -> str:
        """Append one token; return the newly visible text ("" while a character is partial)."""
        self.ids.append(token_id)
        before = self._decode(self.ids[self.prefix:self.read])
        after = self._decode(self.ids[self.prefix:])
        if after.endswith("\ufffd") or len(after) <= len(before):
            return ""
        self.prefix, self.read = self.read, len(self.ids)
        return after[len(before):]


class NoText:
    """Random-weight benchmarks have no tokenizer: tokens only."""

    def add(self, token_id: int) -> str:
        return ""


def detokenizer_for(tokenizer, prompt_ids: list[int]):
    """A Detokenizer after the prompt, or NoText where there is no tokenizer."""
    return Detokenizer(tokenizer, prompt_ids) if tokenizer else NoText()


class StopMatcher:
    """Cuts the stream exactly before the first stop string, even one spanning several tokens.

    Holds back the longest tail that could still begin a stop string.
    """

    def __init__(self, stops: tuple[str, ...]):
        self.stops = stops
        self.pending = ""

    def feed(self, text: str) -> tuple[str, bool]:
        """Returns (text safe to show, stopped)."""
        if not self.stops:
            return text, False
        self.pending += text
        hits = [i for i in (self.pending.find(s) for s in self.stops) if i >= 0]
        if hits:
            out = self.pending[: min(hits)]
            self.pending = ""
            return out, True
        keep = 0
        for s in self.stops:
            for n in range(min(len(s) - 1, len(self.pending)), 0, -1):
                if self.pending.endswith(s[:n]):
                    keep = max(keep, n)
                    break
        cut = len(self.pending) - keep
        out, self.pending = self.pending[:cut], self.pending[cut:]
        return out, False

    def flush(self) -> str:
        """At the end of the stream the held-back tail is real text."""
        out, self.pending = self.pending, ""
        return out
