"""`hearth chat`'s conversation: the messages so far, the slash commands, and one streamed answer
at a time over any `generate(request, cancel)` backend (a local Session or an endpoint). Not the
terminal loop nor the backends (chat_cli.py)."""

from __future__ import annotations

import argparse
import json
import sys
import threading
from collections.abc import Callable, Iterable

from engine.cli.chat_settings import NAMES, AnswerSettings, key_of
from engine.events import BadRequest, Failed, Finished, GenerateRequest, Stats, Token

QUOTES = '"""'
HELP = f"""\
Type a message and press Enter. Multi-line: end a line with a backslash to go on with the next,
or start with {QUOTES} and end with {QUOTES}. Ctrl+C stops an answer (the question and what was
answered stay in the conversation); Ctrl+C again at the prompt, Ctrl+D or /bye leaves.
  /set NAME VALUE
                 set one of {", ".join(NAMES[:4])},
                 {", ".join(NAMES[4:])} for the answers to come (`/set temperature 0.2`;
                 VALUE `default`: the model's own); /set alone shows them all
  /system TEXT   set the system prompt (an empty TEXT removes it)
  /reset         start a new conversation (the system prompt stays)
  /save FILE     write the conversation as JSON (hearth run --messages FILE reads it)
  /stats         figures of the last answer
  /help          this text
  /bye           leave"""


class Leave(Exception):
    """The user asked to leave (Ctrl+D, /bye, a second Ctrl+C)."""


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
        self.settings = AnswerSettings.from_args(args)
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
            self.settings = self.settings.changed(f"system {rest}")
            print(f"system prompt {'set' if rest else 'removed'}", file=self.err)
        elif name == "/set":
            self.set(rest)
        elif name == "/stats":
            print(describe(self.last) if self.last else "no answer yet", file=self.err)
        elif name == "/save":
            self.save(rest)
        else:
            print(f"unknown command {name}; /help lists them", file=self.err)

    def set(self, command: str) -> None:
        """`/set NAME VALUE`; `/set` alone shows the settings. A bad value: one line."""
        if not command:
            print(self.settings.describe(), file=self.err)
            return
        try:
            self.settings = self.settings.changed(command)
        except BadRequest as e:
            print(f"hearth: {e}", file=self.err)
            return
        key = key_of(command.split()[0])
        print(f"{key} is {self.settings.shown(key)}", file=self.err)

    def save(self, path: str) -> None:
        if not path:
            print("/save needs a file name", file=self.err)
            return
        system = self.settings.system
        messages = ([{"role": "system", "content": system}] if system else [])
        messages += self.messages
        try:
            with open(path, "w", encoding="utf-8") as f:
                json.dump(messages, f, ensure_ascii=False, indent=1)
        except OSError as e:
            print(f"cannot save to {path}: {e.strerror or e}", file=self.err)
            return
        print(f"saved {len(messages)} messages to {path}", file=self.err)

    def request(self, text: str) -> GenerateRequest:
        return self.settings.request((*self.messages, {"role": "user", "content": text}))

    def answer(self, text: str, cancel: threading.Event) -> str:
        """Stream one answer; returns how it ended ("eos", "cancelled", "failed", ...). A
        finished or stopped answer joins the conversation with its question, as the window
        keeps a stopped one (what was said before the stop still counts); a failed one is left
        out."""
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
                if event.reason == "repetition":
                    print("[cut: the answer was repeating itself]", file=self.err)
                if event.reason == "cancelled":
                    print("[stopped]", file=self.err)
                # a stop before the first token keeps an empty answer: templates that want
                # user and assistant turns to alternate still render the next question
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

