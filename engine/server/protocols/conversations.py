"""The Responses API's `previous_response_id`: each stored response's conversation (its input
after the previous ones, and its answer; never the instructions, which do not carry over), kept
in memory for the server's life, bounded in count and in characters, the oldest dropped first.
An id no longer (or never) kept is a clear 400.
"""

from __future__ import annotations

import json
from collections import OrderedDict

from engine.server.errors import bad_request

MAX_RESPONSES = 256
MAX_CHARS = 32 << 20  # every kept conversation's JSON together


class Conversations:
    def __init__(self, max_responses: int = MAX_RESPONSES, max_chars: int = MAX_CHARS):
        self.max_responses, self.max_chars = max_responses, max_chars
        self._kept: OrderedDict[str, tuple[list[dict], int]] = OrderedDict()
        self._chars = 0

    def __len__(self) -> int:
        return len(self._kept)

    def history(self, resp_id: str | None) -> list[dict]:
        if resp_id is None:
            return []
        kept = self._kept.get(resp_id)
        if kept is None:
            raise bad_request(f"previous_response_id {resp_id[:80]!r} is not known: this server "
                              f"keeps the last {self.max_responses} stored responses in memory "
                              "while it runs; send the whole conversation as input instead",
                              "previous_response_id", "previous_response_not_found")
        self._kept.move_to_end(resp_id)
        return list(kept[0])

    def keep(self, resp_id: str, conversation: list[dict]) -> None:
        size = len(json.dumps(conversation, ensure_ascii=False))
        if size > self.max_chars:
            return  # larger than the whole store: a later turn finds it gone, and says so
        self._kept[resp_id] = (conversation, size)
        self._chars += size
        while len(self._kept) > self.max_responses or self._chars > self.max_chars:
            _, (_, dropped) = self._kept.popitem(last=False)
            self._chars -= dropped
