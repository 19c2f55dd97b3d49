"""A read-only Markdown view that grows with its text (no inner scroll bar), with fenced code
blocks shaded and highlighted. Used for a message's answer and for its reasoning."""

from __future__ import annotations

from PySide6.QtCore import QSize, Qt
from PySide6.QtGui import QColor, QTextBlockFormat, QTextCursor
from PySide6.QtWidgets import QFrame, QSizePolicy, QTextBrowser

from app.code_highlighter import CodeHighlighter, is_code_block

CODE_BACKGROUND = QColor("#f2f3f5")  # the light palette of the "One Light" scheme


class MarkdownView(QTextBrowser):
    def __init__(self, parent=None) -> None:
        super().__init__(parent)
        self.setOpenExternalLinks(True)
        self.setFrameShape(QFrame.Shape.NoFrame)
        self.setVerticalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        self.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        self.setSizePolicy(QSizePolicy.Policy.Expanding, QSizePolicy.Policy.Fixed)
        self._highlighter = CodeHighlighter(self.document())
        self._markdown = ""
        self.document().documentLayout().documentSizeChanged.connect(
            self._on_layout_document_size_changed)

    @property
    def markdown(self) -> str:
        return self._markdown

    def set_markdown(self, text: str) -> None:
        if text == self._markdown:
            return
        self._markdown = text
        self.setMarkdown(text)
        self._shade_code_blocks()

    def _shade_code_blocks(self) -> None:
        fmt = QTextBlockFormat()
        fmt.setBackground(CODE_BACKGROUND)
        cursor = QTextCursor(self.document())
        block = self.document().begin()
        while block.isValid():
            if is_code_block(block):
                cursor.setPosition(block.position())
                cursor.mergeBlockFormat(fmt)
            block = block.next()

    def sizeHint(self) -> QSize:  # noqa: N802 (Qt override)
        return QSize(super().sizeHint().width(), self._content_height())

    def resizeEvent(self, event) -> None:  # noqa: N802 (Qt override)
        super().resizeEvent(event)
        self.setFixedHeight(self._content_height())

    def _on_layout_document_size_changed(self, _size) -> None:
        self.setFixedHeight(self._content_height())

    def _content_height(self) -> int:
        margins = self.contentsMargins()
        return int(self.document().size().height()) + margins.top() + margins.bottom() + 2
