"""A deliberately simple highlighter for fenced code blocks in a Markdown QTextDocument:
keywords, strings, numbers and line comments of the common languages, by regular expression."""

from __future__ import annotations

import re

from PySide6.QtGui import QColor, QFont, QSyntaxHighlighter, QTextCharFormat, QTextFormat

KEYWORDS = (
    "and as assert async await break case catch class const continue def del do elif else enum "
    "except export extends false False final finally fn for from func function if impl import in "
    "interface is lambda let loop match mod mut new nil None not null or pass pub raise return "
    "self static struct super switch this throw true True try type typeof use var void where "
    "while with yield"
).split()
RULES = (
    ("keyword", re.compile(r"\b(?:" + "|".join(KEYWORDS) + r")\b")),
    ("number", re.compile(r"\b\d+(?:\.\d+)?\b")),
    ("string", re.compile(r"\"(?:[^\"\\]|\\.)*\"|'(?:[^'\\]|\\.)*'|`[^`]*`")),
    ("comment", re.compile(r"(?:#|//|--(?=\s)).*$")),
)
# "One Light" (light) and "One Dark" (dark)
COLORS = {
    False: {"keyword": "#a626a4", "number": "#986801", "string": "#50a14f", "comment": "#a0a1a7"},
    True: {"keyword": "#c678dd", "number": "#d19a66", "string": "#98c379", "comment": "#7f848e"},
}


def is_code_block(block) -> bool:
    return block.blockFormat().hasProperty(QTextFormat.Property.BlockCodeFence)


class CodeHighlighter(QSyntaxHighlighter):
    """Colours only the blocks that Qt's Markdown reader marked as fenced code."""

    def __init__(self, document) -> None:
        super().__init__(document)
        self._formats = {}
        self.set_dark(False)

    def set_dark(self, is_dark: bool) -> None:
        """The dark theme's colours (or the light's); the caller re-renders."""
        self._formats = {}
        for name, color in COLORS[is_dark].items():
            fmt = QTextCharFormat()
            fmt.setForeground(QColor(color))
            if name == "keyword":
                fmt.setFontWeight(QFont.Weight.Bold)
            self._formats[name] = fmt

    def highlightBlock(self, text: str) -> None:  # noqa: N802 (Qt override)
        if not is_code_block(self.currentBlock()):
            return
        # later rules win: a keyword inside a string or a comment takes the string's colour
        for name, pattern in RULES:
            for m in pattern.finditer(text):
                self.setFormat(m.start(), m.end() - m.start(), self._formats[name])
