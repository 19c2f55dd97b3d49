"""A banner at the top of the window for what the user must know: an engine error, a crash.
Never modal; it offers one action (say, "Restart engine") and can be dismissed."""

from __future__ import annotations

from PySide6.QtCore import Signal
from PySide6.QtWidgets import QFrame, QHBoxLayout, QLabel, QPushButton


class NoticePanel(QFrame):
    sig_action_triggered = Signal(str)
    """The user pressed the action button (the action's name)."""

    def __init__(self, parent=None) -> None:
        super().__init__(parent)
        self.setObjectName("noticePanel")
        self.label = QLabel()
        self.label.setWordWrap(True)
        self.action_button = QPushButton()
        self.close_button = QPushButton("Dismiss")
        layout = QHBoxLayout(self)
        layout.addWidget(self.label, 1)
        layout.addWidget(self.action_button)
        layout.addWidget(self.close_button)
        self._action = ""
        self.action_button.clicked.connect(self._on_action_button_clicked)
        self.close_button.clicked.connect(self.hide)
        self.hide()

    @property
    def text(self) -> str:
        return self.label.text()

    def show_message(self, text: str, hint: str = "", action: str = "",
                     is_error: bool = True) -> None:
        self.label.setText(f"{text} {hint}".strip())
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
