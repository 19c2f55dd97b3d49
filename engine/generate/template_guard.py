"""Bounds on rendering a model's chat template: it compiles and renders in a child process,
which is killed past the time bound or on the request's cancel.

Why a process: one C-level operation in a template (`9 ** (9 ** 9)`, a string widened to a
billion characters) runs to its end holding the GIL, so no check inside this process can stop
it, and while it runs no other thread of it (the worker's stdin reader, the server's event
loop) runs either. Rendering is transformers' own (`render_jinja_template`), so the text is the
one `apply_chat_template` gives. Not a sandbox of its own: jinja2's stops escapes.
"""

from __future__ import annotations

import atexit
import json
import math
import queue
import subprocess
import sys
import tempfile
import threading
import time

from engine.files.tokenizer_files import MAX_TEMPLATE_CHARS

MAX_RENDER_S = 5.0  # a real template renders in milliseconds, a long conversation included
MAX_COMPILE_S = 10.0  # the largest template allowed compiles in seconds on a busy machine
# a 1M-token prompt is ~4M characters
MAX_RENDERED_CHARS = 32 * 2**20
MAX_STARTUP_S = 300.0  # importing transformers' chat utilities; only a broken install is slower
# the child's own ceilings, kept by the kernel even where this process is gone: memory above
# what it holds after importing, and CPU seconds a request beyond its wall-clock bound
MAX_CHILD_EXTRA_BYTES = 2**30
CPU_MARGIN_S = 5


class RenderCancelled(Exception):
    """The request was cancelled while its chat template rendered."""


class RenderTooCostly(Exception):
    """The template ran past a time or size bound; str(e) says which, in words."""


class RenderFailed(Exception):
    """The template raised, did not parse or was blocked by the sandbox: (type name, detail)."""


class RenderBudget:
    """One prompt's budget, shared by every rendering it takes (generate/prompt.py renders again
    while it leaves out old turns): `max_s` of rendering in all, `max_chars` a rendering, and
    `max_compile_s` for compiling a template the renderer has not seen. A renderer's start-up
    is not counted: a machine busy importing must not fail a real template."""

    def __init__(self, cancel: threading.Event | None = None, max_s: float = MAX_RENDER_S,
                 max_chars: int = MAX_RENDERED_CHARS, max_compile_s: float = MAX_COMPILE_S):
        self.cancel, self.max_s, self.max_chars = cancel, max_s, max_chars
        self.max_compile_s = max_compile_s
        self.spent_s = 0.0  # rendering so far


class _Renderer:
    """One child process and the thread that reads its replies."""

    def __init__(self):
        self.errors = tempfile.TemporaryFile()  # the child's stderr: why it did not start
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "engine.generate.template_guard"], stdin=subprocess.PIPE,
            stdout=subprocess.PIPE, stderr=self.errors)
        self.replies: queue.SimpleQueue = queue.SimpleQueue()
        self.ready = False
        self.compiled: str | None = None  # the template the child compiled last
        threading.Thread(target=self._read, daemon=True, name="hearth-template-replies").start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            self.replies.put(json.loads(line))
        self.replies.put(None)  # the child is gone

    def _wait(self, deadline: float, cancel: threading.Event | None, too_late: str) -> dict:
        while True:
            if cancel is not None and cancel.is_set():
                raise RenderCancelled()
            left = deadline - time.monotonic()
            if left <= 0:
                raise RenderTooCostly(too_late)
            try:
                reply = self.replies.get(timeout=min(left, 0.05))
            except queue.Empty:
                continue
            if reply is None:
                raise RenderTooCostly("ran its renderer out of memory or CPU time")
            return reply

    def _start(self, cancel: threading.Event | None) -> None:
        """Wait for the child's imports: its start-up is not the template's cost."""
        try:
            self.ready = self._wait(time.monotonic() + MAX_STARTUP_S, cancel, "") == {
                "ready": True}
        except RenderTooCostly:
            pass
        if not self.ready:
            self.errors.seek(0)
            last = self.errors.read().decode(errors="replace").strip().splitlines()[-1:]
            raise RuntimeError("the chat template renderer did not start"
                               + (f": {last[0][:300]}" if last else ""))

    def ask(self, request: dict, max_s: float, cancel: threading.Event | None,
            too_late: str) -> dict:
        if max_s <= 0:  # the prompt's earlier renderings spent the budget
            raise RenderTooCostly(too_late)
        try:  # default=str: a special token held as an object goes as its text
            line = json.dumps({**request, "max_s": max_s}, default=str).encode() + b"\n"
            self.proc.stdin.write(line)
            self.proc.stdin.flush()
        except OSError:
            raise RuntimeError("the chat template renderer stopped") from None
        reply = self._wait(time.monotonic() + max_s, cancel, too_late)
        if "error" in reply:
            raise RenderFailed(reply["error"], reply["detail"])
        if "too_big" in reply:
            raise RenderTooCostly(
                f"needed more than {MAX_CHILD_EXTRA_BYTES / 2**30:g} GiB of memory")
        if "too_long" in reply:
            raise RenderTooCostly(f"rendered more than {request['max_chars']:,} characters")
        return reply

    def render(self, template: str, messages: list[dict], kwargs: dict,
               budget: RenderBudget) -> str:
        if not self.ready:
            self._start(budget.cancel)
        if template != self.compiled:
            self.compiled = None
            self.ask({"compile": template}, budget.max_compile_s, budget.cancel,
                     f"took more than {budget.max_compile_s:g} s to compile")
            self.compiled = template
        request = {"render": template, "messages": messages, "kwargs": kwargs,
                   "max_chars": budget.max_chars}
        started = time.monotonic()
        try:
            return self.ask(request, budget.max_s - budget.spent_s, budget.cancel,
                            f"took more than {budget.max_s:g} s to render")["text"]
        finally:
            budget.spent_s += time.monotonic() - started

    def kill(self) -> None:
        self.proc.kill()
        self.proc.wait()


class _Pool:
    """Idle renderers, one taken per rendering: any thread may render, and a renderer that ran
    past a bound is killed rather than given back."""

    def __init__(self):
        self._idle: list[_Renderer] = []
        self._lock = threading.Lock()

    def prewarm(self) -> None:
        """Start a renderer now (it imports while a model loads), unless one is idle."""
        with self._lock:
            if not self._idle:
                self._idle.append(_Renderer())

    def render(self, template: str, messages: list[dict], kwargs: dict,
               budget: RenderBudget) -> str:
        with self._lock:
            renderer = self._idle.pop() if self._idle else None
        if renderer is None or renderer.proc.poll() is not None:  # none, or one ended idle
            renderer = _Renderer()
        try:
            text = renderer.render(template, messages, kwargs, budget)
        except RenderFailed:  # the template's error; the child is fine
            self._give_back(renderer)
            raise
        except BaseException:
            renderer.kill()
            raise
        self._give_back(renderer)
        return text

    def _give_back(self, renderer: _Renderer) -> None:
        with self._lock:
            self._idle.append(renderer)

    def close(self) -> None:
        """End the idle renderers (at exit; they would also end on their stdin's EOF)."""
        with self._lock:
            idle, self._idle = self._idle, []
        for renderer in idle:
            renderer.kill()


_POOL = _Pool()
atexit.register(_POOL.close)
prewarm = _POOL.prewarm


def render(template: str, messages: list[dict], kwargs: dict, budget: RenderBudget) -> str:
    """transformers' rendering of `template` over `messages` with the generation prompt and
    `kwargs` (the special tokens), in a child process under `budget`. Raises RenderCancelled,
    RenderTooCostly or RenderFailed."""
    if len(template) > MAX_TEMPLATE_CHARS:
        raise RenderTooCostly(f"is {len(template):,} characters long, more than the "
                              f"{MAX_TEMPLATE_CHARS:,} a chat template may have")
    if budget.cancel is not None and budget.cancel.is_set():
        raise RenderCancelled()
    return _POOL.render(template, messages, kwargs, budget)


def _limit_self() -> None:
    """No core files, and memory bounded (POSIX; elsewhere the parent's kill is the bound)."""
    try:
        import resource
    except ImportError:
        return
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    try:
        with open("/proc/self/status") as f:
            vm = next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmSize:"))
        _, hard = resource.getrlimit(resource.RLIMIT_AS)
        want = vm + MAX_CHILD_EXTRA_BYTES
        if hard == resource.RLIM_INFINITY or want < hard:
            resource.setrlimit(resource.RLIMIT_AS, (want, hard))
    except (OSError, ValueError, StopIteration):
        pass


def _cpu_limit(max_s: float) -> None:
    """The kernel ends this process (SIGXCPU) past `max_s` more CPU seconds: a render that holds
    the GIL stops even where the parent died before killing it."""
    try:
        import resource
    except ImportError:
        return
    used = resource.getrusage(resource.RUSAGE_SELF)
    _, hard = resource.getrlimit(resource.RLIMIT_CPU)
    soft = int(used.ru_utime + used.ru_stime + math.ceil(max_s)) + CPU_MARGIN_S
    if hard == resource.RLIM_INFINITY or soft < hard:
        resource.setrlimit(resource.RLIMIT_CPU, (soft, hard))


def _without_nones(messages: list[dict]) -> list[dict]:
    """What apply_chat_template does to messages before rendering (transformers 5.25's
    _normalize_chat_messages; 5.17, within the pin, has no such function): keys whose value is
    None are dropped, since templates test whether a key is there (`content: null` beside
    tool_calls would render "None")."""
    return [{k: v for k, v in m.items() if v is not None} for m in messages]


def _serve() -> None:
    """The child: one JSON request a line on stdin, one reply a line on stdout, until EOF."""
    from transformers.utils.chat_template_utils import (
        _compile_jinja_template,
        render_jinja_template,
    )

    _limit_self()
    out = sys.stdout.buffer
    out.write(b'{"ready": true}\n')
    out.flush()
    for line in sys.stdin.buffer:
        request = json.loads(line)
        _cpu_limit(request["max_s"])
        try:
            if "compile" in request:
                _compile_jinja_template(request["compile"])
                reply = {"ok": True}
            else:
                # what tokenizer.apply_chat_template(messages, tokenize=False,
                # add_generation_prompt=True) does around the same call
                rendered, _ = render_jinja_template(
                    conversations=[_without_nones(request["messages"])],
                    chat_template=request["render"], add_generation_prompt=True,
                    **request["kwargs"])
                text = rendered[0]
                reply = ({"too_long": len(text)} if len(text) > request["max_chars"]
                         else {"text": text})
        except MemoryError:  # past the child's memory bound: a cost, not a template error
            reply = {"too_big": True}
        except Exception as e:  # SecurityError, TemplateSyntaxError, raise_exception(...), ...
            reply = {"error": type(e).__name__, "detail": str(e)}
        out.write(json.dumps(reply).encode() + b"\n")
        out.flush()


if __name__ == "__main__":
    _serve()
