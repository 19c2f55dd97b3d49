"""The thinking of models that think (`<think>...</think>`: Qwen3, the DeepSeek-R1 distills, QwQ)
apart from the answer. A template may open the thinking itself (the R1 distills' generation
prompt ends in `<think>`), so the reader can start inside it; one that closes it in the prompt
(Qwen3 with enable_thinking false) leaves the answer all content. Whitespace around the thinking
is the template's layout, not content, and is dropped alike streamed or whole.
"""

from __future__ import annotations

from engine.answer.parts import Content, Reasoning

OPEN, CLOSE = "<think>", "</think>"


def thinks(template: str | None) -> bool:
    """Whether a chat template knows the think tags (it writes or strips them)."""
    return bool(template) and (OPEN in template or CLOSE in template)


def opens_thinking(prompt_text: str) -> bool:
    """Whether the rendered prompt leaves a thinking open for the answer to go on with."""
    return prompt_text.rfind(OPEN) > prompt_text.rfind(CLOSE)


def _partial(text: str, marker: str) -> int:
    """Length of the longest tail of `text` that begins `marker`."""
    for n in range(min(len(marker) - 1, len(text)), 0, -1):
        if text.endswith(marker[:n]):
            return n
    return 0


class ReasoningReader:
    """Answer text in, Reasoning and Content parts out."""

    def __init__(self, thinking_open: bool = False):
        self.stage = "thinking" if thinking_open else "start"  # start -> thinking -> answer
        self.pending = ""
        self.trim = thinking_open  # whitespace to drop before the next word

    def feed(self, text: str) -> list:
        self.pending += text
        out: list = []
        while True:
            if self.trim:
                self.pending = self.pending.lstrip()
                if not self.pending:
                    return out
                self.trim = False
            if self.stage == "start":
                if OPEN.startswith(self.pending.lstrip()):
                    return out  # "<thi": perhaps the tag
                if self.pending.lstrip().startswith(OPEN):
                    self.pending = self.pending.lstrip()[len(OPEN):]
                    self.stage, self.trim = "thinking", True
                    continue
                self.stage = "answer"
            if self.stage == "answer":
                if self.pending:
                    out.append(Content(self.pending))
                self.pending = ""
                return out
            at = self.pending.find(CLOSE)
            if at >= 0:
                thought = self.pending[:at].rstrip()
                if thought:
                    out.append(Reasoning(thought))
                self.pending = self.pending[at + len(CLOSE):]
                self.stage, self.trim = "answer", True
                continue
            # hold back a partial close tag and trailing whitespace (it may end the thinking)
            keep = _partial(self.pending, CLOSE)
            body = self.pending[:len(self.pending) - keep]
            ready = body.rstrip()
            if ready:
                out.append(Reasoning(ready))
            self.pending = self.pending[len(ready):]
            return out

    def finish(self) -> list:
        """The answer ended: held text goes out (a thinking cut short stays reasoning)."""
        text, self.pending = self.pending, ""
        if self.stage == "thinking":
            return [Reasoning(text.rstrip())] if text.strip() else []
        return [Content(text)] if text and not self.trim else []
