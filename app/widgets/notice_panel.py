"""A banner at the top of the window for what the user must know: an engine error, a crash.
Never modal; it offers one action (say, "Restart engine") and can be dismissed. It sits in the
window's layout above the content (never over it), its text wrapped; `code` is shown as code."""

from __future__ import annotations

import html
import re

from PySide6.QtCore import Qt, Signal
from PySide6.QtWidgets import QFrame, QHBoxLayout, QLabel, QPushButton, QSizePolicy

CODE_SPAN = re.compile(r"`([^`\n]+)`")  # Markdown's inline code: `hearth import --starter`


def rich_text(text: str) -> str:
    """Plain text (an engine's error may hold `<` or `&`) as rich text, `code` as <code>."""
    return CODE_SPAN.sub(r"<code>\1</code>", html.escape(text, quote=False))


class NoticePanel(QFrame):
    sig_action_triggered = Signal(str)
    """The user pressed the action button (the action's name)."""

    def __init__(self, parent=None) -> None:
        super().__init__(parent)
        self.setObjectName("noticePanel")
        self.setSizePolicy(QSizePolicy.Policy.Preferred, QSizePolicy.Policy.Maximum)
        self.label = QLabel()
        self.label.setTextFormat(Qt.TextFormat.RichText)
        self.label.setWordWrap(True)
        self.label.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        self.action_button = QPushButton()
        self.close_button = QPushButton("Dismiss")
        layout = QHBoxLayout(self)
        layout.addWidget(self.label, 1)
        layout.addWidget(self.action_button, 0, Qt.AlignmentFlag.AlignTop)
        layout.addWidget(self.close_button, 0, Qt.AlignmentFlag.AlignTop)
        self._text = ""
        self._action = ""
        self.action_button.clicked.connect(self._on_action_button_clicked)
        self.close_button.clicked.connect(self.hide)
        self.hide()

    @property
    def text(self) -> str:
        """What the banner says, as plain text."""
        return self._text

    def show_message(self, text: str, hint: str = "", action: str = "",
                     is_error: bool = True) -> None:
        self._text = f"{text} {hint}".strip()
        self.label.setText(rich_text(self._text))
        self.setProperty("severity", "error" if is_error else "info")
        self.style().unpolish(self)
        self.style().polish(self)
        self._action = action
        self.action_button.setText(action)
        self.action_button.setVisible(bool(action))
        self.show()

    def _on_action_button_clicked(self) -> None:
        self.hide()
        self.sig_action_triggered.emit(self._action)
