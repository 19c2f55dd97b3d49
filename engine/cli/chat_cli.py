"""`hearth chat`: a terminal chat over the engine's Session (or an OpenAI-compatible endpoint),
as `ollama run` is: streamed answers, the conversation kept across turns (its K/V reused), piped
stdin answered message by message. No torch at import: arguments are checked first."""

from __future__ import annotations

import argparse
import signal
import sys
import threading
from collections.abc import Callable, Iterator

from engine.cli.chat_conversation import HELP, QUOTES, Chat, Leave
from engine.cli.chat_settings import DEFAULT_MAX_TOKENS
from engine.events import BadRequest, Loaded, LoadProgress, LoadRequest

PROMPT, MORE = ">>> ", "... "


def add_parser(sub) -> None:
    p = sub.add_parser("chat", help="chat in the terminal (piped stdin: answer each message)",
                       description=HELP, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", help="a model folder, a name in Hearth's models folder (`hearth "
                   "list`) or a cached Hugging Face repo id (default: the starter model once "
                   "imported, else the bundled demo model)")
    p.add_argument("--system", help="the system prompt to start with")
    p.add_argument("--quant", default="auto")
    p.add_argument("--kv-dtype", default="auto")
    p.add_argument("--context", type=int)
    p.add_argument("--device", default="auto")
    p.add_argument("--max-new-tokens", type=int, default=DEFAULT_MAX_TOKENS)
    p.add_argument("--temperature", type=float)
    p.add_argument("--top-p", type=float)
    p.add_argument("--top-k", type=int)
    p.add_argument("--repetition-penalty", type=float)
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


def interactive(chat: Chat, read_line: Callable[[str], str] = input) -> None:
    """The terminal loop: Ctrl+C during an answer stops it (the engine checks between two
    steps, so the session stays consistent); Ctrl+C at the prompt twice with no answer between,
    or once after a stopped answer, leaves."""
    print("Type /help for help, Ctrl+D or /bye to leave.", file=chat.err)
    # the chat owns Ctrl+C at its prompt: a process started where SIGINT is ignored (from a
    # script's background job, which the terminal's later foreground does not undo) would
    # otherwise never see KeyboardInterrupt there
    signal.signal(signal.SIGINT, signal.default_int_handler)
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
