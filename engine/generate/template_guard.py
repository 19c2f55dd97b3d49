"""Bounds on rendering a model's chat template: time, output size, and the request's cancel.

The Jinja sandbox stops escapes, not CPU exhaustion: three nested loops over range(100000) call
nothing and print nothing, so no sandbox hook ever runs. A trace function on the rendering
thread sees every line and call of the template's code instead. Not a sandbox of its own: one
C-level operation (a huge `**`) runs to its end before the trace function sees the next line.
"""

from __future__ import annotations

import sys
import threading
import time
from contextlib import contextmanager

MAX_RENDER_S = 5.0  # a real template renders in milliseconds, a long conversation included
# a 1M-token prompt is ~4M characters; macros' output may be counted twice (theirs, then ours)
MAX_RENDERED_CHARS = 32 * 2**20


class RenderCancelled(Exception):
    """The request was cancelled while its chat template rendered."""


class RenderTooCostly(Exception):
    """The template ran past the time or size bound; str(e) says which, in words."""


class RenderBudget:
    """One prompt's budget, shared by every rendering it takes (generate/prompt.py renders again
    while
    it leaves out old turns): `max_s` in all, `max_chars` a rendering."""

    def __init__(self, cancel: threading.Event | None = None, max_s: float = MAX_RENDER_S,
                 max_chars: int = MAX_RENDERED_CHARS):
        self.cancel, self.max_s, self.max_chars = cancel, max_s, max_chars
        self.deadline = time.monotonic() + max_s

    def _check(self) -> None:
        if self.cancel is not None and self.cancel.is_set():
            raise RenderCancelled()
        if time.monotonic() > self.deadline:
            raise RenderTooCostly(f"took more than {self.max_s:g} s to render")

    @contextmanager
    def watching(self):
        """Run the body under the budget; raises RenderCancelled or RenderTooCostly in it."""
        chars = 0

        def in_template(frame, event, arg):
            nonlocal chars
            # a template's render function is a generator: each output piece is a "return"
            if event == "return" and type(arg) is str:
                chars += len(arg)
                if chars > self.max_chars:
                    raise RenderTooCostly(f"rendered more than {self.max_chars:,} characters")
            self._check()
            return in_template

        def elsewhere(frame, event, arg):  # jinja's runtime, filters, transformers around it
            self._check()
            return elsewhere

        def on_call(frame, event, arg):
            self._check()
            return in_template if "__jinja_template__" in frame.f_globals else elsewhere

        self._check()
        previous = sys.gettrace()  # a debugger's or coverage's, restored after
        sys.settrace(on_call)  # this thread only: the worker's reader thread runs on untraced
        try:
            yield
        finally:
            sys.settrace(previous)
