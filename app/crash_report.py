"""The engine's real error out of what a dead worker left on stderr: the exception a traceback
ends in, or a fatal line (CUDA, a signal, out of memory), not the last warning a library printed
on its way down."""

from __future__ import annotations

import re

# "ValueError: ...", "torch.OutOfMemoryError: ...", "RuntimeError" alone
EXCEPTION_LINE = re.compile(r"^(?:[A-Za-z_][\w]*\.)*[A-Z]\w*(?:Error|Exception|Interrupt|Exit)"
                            r"\b(?::\s*(?P<message>.*))?$")
FATAL_LINE = re.compile(r"(?i)\b(?:fatal|segmentation fault|core dumped|out of memory|"
                        r"killed|abort(?:ed)?|CUDA error)\b")
WARNING_LINE = re.compile(r"(?i)warn(?:ing)?s?\b|^\s*warnings\.warn")  # UserWarning too
MAX_CHARS = 300


def engine_error(stderr_tail: str) -> str:
    """The line that says why the worker died, or "" when the tail holds only warnings."""
    lines = [line.rstrip() for line in stderr_tail.splitlines() if line.strip()]
    for line in reversed(lines):  # the last exception is the one that ended the process
        if not line.startswith((" ", "\t")) and EXCEPTION_LINE.match(line):
            return _short(line)
    for line in reversed(lines):
        if FATAL_LINE.search(line) and not WARNING_LINE.search(line):
            return _short(line)
    # no error named: the last line that is not a warning (nor a warning's source line)
    for i in range(len(lines) - 1, -1, -1):
        is_source = lines[i].startswith((" ", "\t")) and i and WARNING_LINE.search(lines[i - 1])
        if not WARNING_LINE.search(lines[i]) and not is_source:
            return _short(lines[i])
    return ""


def _short(line: str) -> str:
    line = line.strip()
    return line if len(line) <= MAX_CHARS else line[:MAX_CHARS - 1] + "…"
