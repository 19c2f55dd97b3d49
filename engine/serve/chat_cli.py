"""`hearth chat`: a terminal chat over the engine's Session (or an OpenAI-compatible endpoint),
as `ollama run` is: streamed answers, the conversation kept across turns (its K/V reused), piped
stdin answered message by message. No torch at import: arguments are checked first."""

from __future__ import annotations

import argparse
import json
import signal
import sys
import threading
from collections.abc import Callable, Iterable, Iterator

from engine.events import (
    BadRequest,
    Failed,
    Finished,
    GenerateRequest,
    Loaded,
    LoadProgress,
    LoadRequest,
    SamplingParams,
    Stats,
    Token,
)

PROMPT, MORE = ">>> ", "... "
QUOTES = '"""'
HELP = f"""\
Type a message and press Enter. Multi-line: end a line with a backslash to go on with the next,
or start with {QUOTES} and end with {QUOTES}. Ctrl+C stops an answer; Ctrl+C again at the prompt,
Ctrl+D or /bye leaves.
  /system TEXT   set the system prompt (an empty TEXT removes it)
  /reset         start a new conversation (the system prompt stays)
  /save FILE     write the conversation as JSON (hearth run --messages FILE reads it)
  /stats         figures of the last answer
  /help          this text
  /bye           leave"""


class Leave(Exception):
    """The user asked to leave (Ctrl+D, /bye, a second Ctrl+C)."""


def add_parser(sub) -> None:
    p = sub.add_parser("chat", help="chat in the terminal (piped stdin: answer each message)",
                       description=HELP, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", help="model folder or cached Hugging Face repo id "
                   "(default: the bundled demo model)")
    p.add_argument("--system", help="the system prompt to start with")
    p.add_argument("--quant", default="auto")
    p.add_argument("--kv-dtype", default="auto")
    p.add_argument("--context", type=int)
    p.add_argument("--device", default="auto")
    p.add_argument("--max-new-tokens", type=int, default=512)
    p.add_argument("--temperature", type=float)
    p.add_argument("--top-p", type=float)
    p.add_argument("--top-k", type=int)
    p.add_argument("--seed", type=int)
    p.add_argument("--endpoint", metavar="URL", help="chat with an OpenAI-compatible endpoint "
                   "(its base URL, e.g. http://host:8000/v1); --model is its model id")
    p.add_argument("--api-key", metavar="KEY", help="the endpoint's API key (or set "
                   "HEARTH_API_KEY, which `ps` does not show)")


def read_message(read_line: Callable[[str], str], first_prompt: str = PROMPT,
                 more_prompt: str = MORE) -> str:
    """One message from `read_line` (input-like: raises EOFError at the end). A line ending in a
    backslash goes on with the next line; a message that starts with triple quotes goes on until
    a line that ends with them. EOFError inside an unfinished message ends it there."""
    line = read_line(first_prompt)
    if line.lstrip().startswith(QUOTES):
        text = line.lstrip()[len(QUOTES):]
        lines = []
        while True:
            if text.rstrip().endswith(QUOTES):
                lines.append(text.rstrip()[:-len(QUOTES)])
                return "\n".join(lines).strip("\n")
            lines.append(text)
            try:
                text = read_line(more_prompt)
            except EOFError:
                return "\n".join(lines).strip("\n")
    lines = []
    while line.endswith("\\"):
        lines.append(line[:-1])
        try:
            line = read_line(more_prompt)
        except EOFError:
            line = ""
            break
    lines.append(line)
    return "\n".join(lines)


def describe(stats: Stats) -> str:
    """/stats: the last answer's figures, prompt reuse included."""
    return (f"{stats.new_tokens} tokens, ttft {stats.ttft_ms:.0f} ms, "
            f"{stats.decode_tokens_per_s:.1f} tokens/s; prompt {stats.prompt_tokens} tokens "
            f"({stats.cached_prompt_tokens} from the cache, {stats.computed_prompt_tokens} "
            f"computed); context used {stats.context_used_tokens} tokens")


class Chat:
    """The conversation and its commands over a `generate(request, cancel)` backend."""

    def __init__(self, generate: Callable[[GenerateRequest, threading.Event], Iterable],
                 args: argparse.Namespace, out=None, err=None,
                 new_cancel: Callable[[], threading.Event] = threading.Event):
        self.generate = generate
        self.new_cancel = new_cancel  # what a Ctrl+C sets: a flag, or one that closes a socket
        self.args = args
        self.out, self.err = out or sys.stdout, err or sys.stderr
        self.system: str | None = args.system
        self.messages: list[dict] = []
        self.last: Stats | None = None
        self.num_failed = 0

    def command(self, text: str) -> None:
        name, _, rest = text.strip().partition(" ")
        rest = rest.strip()
        if name in ("/bye", "/exit", "/quit"):
            raise Leave()
        if name == "/help":
            print(HELP, file=self.err)
        elif name == "/reset":
            self.messages.clear()
            print("a new conversation", file=self.err)
        elif name == "/system":
            self.system = rest or None
            print(f"system prompt {'set' if rest else 'removed'}", file=self.err)
        elif name == "/stats":
            print(describe(self.last) if self.last else "no answer yet", file=self.err)
        elif name == "/save":
            self.save(rest)
        else:
            print(f"unknown command {name}; /help lists them", file=self.err)

    def save(self, path: str) -> None:
        if not path:
            print("/save needs a file name", file=self.err)
            return
        messages = ([{"role": "system", "content": self.system}] if self.system else [])
        messages += self.messages
        try:
            with open(path, "w", encoding="utf-8") as f:
                json.dump(messages, f, ensure_ascii=False, indent=1)
        except OSError as e:
            print(f"cannot save to {path}: {e.strerror or e}", file=self.err)
            return
        print(f"saved {len(messages)} messages to {path}", file=self.err)

    def request(self, text: str) -> GenerateRequest:
        a = self.args
        req = GenerateRequest(messages=(*self.messages, {"role": "user", "content": text}),
                              system=self.system, max_new_tokens=a.max_new_tokens,
                              sampling=SamplingParams(a.temperature, a.top_p, a.top_k, None,
                                                      a.seed))
        req.validate()
        return req

    def answer(self, text: str, cancel: threading.Event) -> str:
        """Stream one answer; returns how it ended ("eos", "cancelled", "failed", ...). A
        finished answer joins the conversation; a stopped or failed one is left out."""
        try:
            req = self.request(text)
        except BadRequest as e:
            print(f"hearth: {e}", file=self.err)
            return "failed"
        parts = []
        for event in self.generate(req, cancel):
            if isinstance(event, Token):
                parts.append(event.text)
                self.out.write(event.text)
                self.out.flush()
            elif isinstance(event, Finished):
                self.last = event.stats
                self.out.write("\n")
                self.out.flush()
                if event.reason == "cancelled":
                    print("[stopped]", file=self.err)
                else:
                    self.messages += [{"role": "user", "content": text},
                                      {"role": "assistant", "content": "".join(parts)}]
                return event.reason
            elif isinstance(event, Failed):
                self.out.write("\n" if parts else "")
                print(f"hearth: {event.error}" + (f" ({event.hint})" if event.hint else ""),
                      file=self.err)
                self.num_failed += 1
                return "failed"
        return "failed"

    def handle(self, text: str, cancel: threading.Event) -> str | None:
        if text.lstrip().startswith("/"):
            self.command(text)
            return None
        if not text.strip():
            return None
        return self.answer(text, cancel)


def interactive(chat: Chat, read_line: Callable[[str], str] = input) -> None:
    """The terminal loop: Ctrl+C during an answer stops it (the engine checks between two
    steps, so the session stays consistent); Ctrl+C at the prompt twice with no answer between,
    or once after a stopped answer, leaves."""
    print("Type /help for help, Ctrl+D or /bye to leave.", file=chat.err)
    interrupted = False
    while True:
        try:
            text = read_message(read_line)
        except EOFError:
            print(file=chat.err)
            return
        except KeyboardInterrupt:
            if interrupted:
                print(file=chat.err)
                return
            interrupted = True
            print("\n(Ctrl+C again, Ctrl+D or /bye to leave)", file=chat.err)
            continue
        try:
            with _sigint_cancels(chat.new_cancel()) as cancel:
                reason = chat.handle(text, cancel)
        except Leave:
            return
        if reason is not None:  # a message was answered; a command leaves the count as it is
            interrupted = reason == "cancelled"


def piped(chat: Chat, lines: Iterator[str]) -> None:
    """stdin is not a terminal: every message read is answered, then the chat ends."""
    def read_line(_prompt: str) -> str:
        line = next(lines, None)
        if line is None:
            raise EOFError
        return line.rstrip("\n")

    while True:
        try:
            text = read_message(read_line, "", "")
        except EOFError:
            return
        try:
            with _sigint_cancels(chat.new_cancel()) as cancel:
                chat.handle(text, cancel)
        except Leave:
            return


class _sigint_cancels:
    """While an answer runs, SIGINT sets a cancel flag instead of raising KeyboardInterrupt in
    the middle of a model step."""

    def __init__(self, cancel: threading.Event):
        self.cancel = cancel

    def __enter__(self) -> threading.Event:
        self.previous = signal.signal(signal.SIGINT, lambda *_: self.cancel.set())
        return self.cancel

    def __exit__(self, *exc) -> None:
        signal.signal(signal.SIGINT, self.previous)


def run(args: argparse.Namespace) -> int:
    chat = _remote_chat(args) if args.endpoint is not None else _local_chat(args)
    if chat is None:
        return 1
    if sys.stdin.isatty():
        try:
            import readline  # noqa: F401 (line editing and history for input())
        except ImportError:
            pass
        interactive(chat)
    else:
        piped(chat, iter(sys.stdin))
    return 1 if chat.num_failed else 0


def _remote_chat(args: argparse.Namespace) -> Chat | None:
    """The same chat over an OpenAI-compatible endpoint (engine/remote): no torch at all."""
    from engine.remote.cancel import CancelToken
    from engine.remote.client import check_model, stream_chat
    from engine.remote.failures import RemoteError
    from engine.remote.run_command import api_key, check_args

    check_args(args)  # local-only settings refused, the URL and key checked: exit 2
    Chat(lambda r, c: (), args).request("check")
    key = api_key(args)
    try:
        check_model(args.endpoint, args.model, key)
    except RemoteError as e:
        failed = e.failed()
        if failed.bad_input:
            raise BadRequest(failed.error) from None
        print(f"hearth: {failed.error}" + (f" ({failed.hint})" if failed.hint else ""),
              file=sys.stderr)
        return None

    class Cancel(CancelToken):
        set = CancelToken.cancel  # Ctrl+C also closes the connection a read may block on

    print(f"chatting with {args.model} at {args.endpoint}", file=sys.stderr)
    return Chat(lambda req, cancel: stream_chat(args.endpoint, args.model, req, api_key=key,
                                                cancel=cancel), args, new_cancel=Cancel)


def _local_chat(args: argparse.Namespace) -> Chat:
    from engine.files.model_folder import check

    load = LoadRequest(model=args.model, quant=args.quant, kv_dtype=args.kv_dtype,
                       context=args.context, device=args.device)
    load.validate()
    Chat(lambda r, c: (), args).request("check")  # the sampling settings, before torch
    check(load.model)  # a bad folder fails in well under a second

    from engine.generate.session import Session

    def progress(event: LoadProgress) -> None:
        if event.message:
            print(f"[{event.done + 1}/{event.total}] {event.message}", file=sys.stderr)

    session = Session.load(load, progress)
    loaded: Loaded = session.loaded_event()
    print(f"loaded {loaded.architecture} as {loaded.quant} on {loaded.device}, context "
          f"{loaded.context}", file=sys.stderr)
    return Chat(session.generate, args)
