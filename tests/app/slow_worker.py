"""The real worker (`python -m engine.cli.worker`) with each token event held back a little
(HEARTH_TOKEN_DELAY_S, default 0.02 s), so that a stop or a close lands mid-answer although the
demo model answers a question in twenty tokens at ~350 tokens/s. The engine runs unchanged:
the pause is in the write of the event, so the engine thread waits there, between two steps."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

TOKEN_PREFIX = '{"event": "token"'  # engine.events.event_to_json's form


class SlowTokens:
    """A text stream that pauses before each token event it writes."""

    def __init__(self, out, delay_s: float) -> None:
        self.out, self.delay_s = out, delay_s

    def write(self, text: str) -> int:
        if text.startswith(TOKEN_PREFIX):
            time.sleep(self.delay_s)
        return self.out.write(text)

    def __getattr__(self, name: str):
        return getattr(self.out, name)


if __name__ == "__main__":
    sys.stdout = SlowTokens(sys.stdout, float(os.environ.get("HEARTH_TOKEN_DELAY_S", "0.02")))
    from engine.cli import worker  # noqa: E402 (after the stream is wrapped: main() takes stdout)

    sys.exit(worker.main())
