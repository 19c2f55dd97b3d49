"""A read-only Markdown view that grows with its text (no inner scroll bar), with fenced code
blocks shaded and highlighted in the theme's colours, each with a Copy button at its top right.
Used for a message's answer and for its reasoning."""

from __future__ import annotations

from PySide6.QtCore import QEvent, QSize, Qt, QTimer
from PySide6.QtGui import QColor, QGuiApplication, QTextBlockFormat, QTextCursor, QTextFormat
from PySide6.QtWidgets import QFrame, QSizePolicy, QTextBrowser, QToolButton

from app.chat.code_highlighter import CodeHighlighter, is_code_block
from app.widgets.theme import is_dark

# "One Light" and "One Dark"'s backgrounds
CODE_BACKGROUND = {False: QColor("#f2f3f5"), True: QColor("#2c313a")}
COPIED_MS = 1200  # how long a copy button says "Copied"
THEME_EVENTS = (QEvent.Type.PaletteChange, QEvent.Type.ApplicationPaletteChange,
                QEvent.Type.StyleChange)


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
        self._is_dark = is_dark(QGuiApplication.palette())
        self._highlighter.set_dark(self._is_dark)
        self.code_blocks: list[str] = []  # the text of each fenced code block, in order
        self.copy_buttons: list[QToolButton] = []  # one per code block, reused while streaming
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
        self._place_copy_buttons()

    def changeEvent(self, event) -> None:  # noqa: N802 (Qt override)
        super().changeEvent(event)
        # the application's palette: a style sheet may still be polishing this widget's own
        if event.type() in THEME_EVENTS and is_dark(QGuiApplication.palette()) != self._is_dark:
            self._is_dark = is_dark(QGuiApplication.palette())  # the theme changed: colours anew
            self._highlighter.set_dark(self._is_dark)
            text, self._markdown = self._markdown, None
            self.set_markdown(text)

    def _shade_code_blocks(self) -> None:
        fmt = QTextBlockFormat()
        fmt.setBackground(CODE_BACKGROUND[self._is_dark])
        cursor = QTextCursor(self.document())
        block = self.document().begin()
        while block.isValid():
            if is_code_block(block):
                cursor.setPosition(block.position())
                cursor.mergeBlockFormat(fmt)
            block = block.next()

    def _code_block_starts(self) -> list:
        """(first block, text) of each fenced block: a run of code lines of one language."""
        found, block, language = [], self.document().begin(), None
        while block.isValid():
            if is_code_block(block):
                lang = block.blockFormat().property(QTextFormat.Property.BlockCodeLanguage)
                if found and found[-1][2] and lang == language:
                    found[-1][1].append(block.text())
                else:
                    found.append([block, [block.text()], True])
                language = lang
            elif found:
                found[-1][2] = False
            block = block.next()
        return [(first, "\n".join(lines)) for first, lines, _ in found]

    def _place_copy_buttons(self) -> None:
        starts = self._code_block_starts()
        self.code_blocks = [text for _, text in starts]
        while len(self.copy_buttons) < len(starts):
            button = QToolButton(self.viewport())
            button.setObjectName("codeCopyButton")
            button.setText("Copy")
            button.setToolTip("Copy this code")
            button.setCursor(Qt.CursorShape.PointingHandCursor)
            i = len(self.copy_buttons)
            button.clicked.connect(lambda _=False, i=i: self._on_copy_button_clicked(i))
            self.copy_buttons.append(button)
        layout = self.document().documentLayout()
        for i, button in enumerate(self.copy_buttons):
            button.setVisible(i < len(starts))
            if i < len(starts):
                rect = layout.blockBoundingRect(starts[i][0])
                button.adjustSize()
                button.move(int(rect.right()) - button.width() - 4, int(rect.top()) + 2)
                button.raise_()

    def _on_copy_button_clicked(self, i: int) -> None:
        if i < len(self.code_blocks):
            QGuiApplication.clipboard().setText(self.code_blocks[i])
            button = self.copy_buttons[i]
            button.setText("Copied")
            QTimer.singleShot(COPIED_MS, button, lambda: button.setText("Copy"))

    def sizeHint(self) -> QSize:  # noqa: N802 (Qt override)
        return QSize(super().sizeHint().width(), self._content_height())

    def resizeEvent(self, event) -> None:  # noqa: N802 (Qt override)
        super().resizeEvent(event)
        self.setFixedHeight(self._content_height())
        self._place_copy_buttons()

    def _on_layout_document_size_changed(self, _size) -> None:
        self.setFixedHeight(self._content_height())
        self._place_copy_buttons()

    def _content_height(self) -> int:
        margins = self.contentsMargins()
        return int(self.document().size().height()) + margins.top() + margins.bottom() + 2
