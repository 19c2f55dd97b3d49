"""Split a reply into its reasoning (Qwen3's `<think>...</think>`) and its answer; plain text."""

from __future__ import annotations

from dataclasses import dataclass

OPEN, CLOSE = "<think>", "</think>"


@dataclass(frozen=True)
class ThinkSplit:
    reasoning: str
    answer: str
    is_thinking: bool  # the reasoning block is still open: the model is thinking now


def split_think(text: str) -> ThinkSplit:
    start, end = text.find(OPEN), text.find(CLOSE)
    if end != -1 and (start == -1 or start > end):
        # the chat template opened the block in the prompt: only its end is in the reply
        return ThinkSplit(text[:end].strip(), text[end + len(CLOSE):].strip(), False)
    if start == -1:
        stripped = text.lstrip()
        if stripped and OPEN.startswith(stripped):  # "<thi" while streaming: not shown yet
            return ThinkSplit("", "", True)
        return ThinkSplit("", text, False)
    before = text[:start]
    if end == -1:
        return ThinkSplit(text[start + len(OPEN):].strip(), before.strip(), True)
    after = text[end + len(CLOSE):]
    return ThinkSplit(text[start + len(OPEN):end].strip(), (before + after).strip(), False)


def answer_only(text: str) -> str:
    """What goes back to the model as history: the answer without the reasoning."""
    return split_think(text).answer
