"""One message in the transcript: who, its answer as Markdown (a copy button on each code
block; an answer under an output schema as indented JSON), its thinking folded (how many words,
how many seconds), its status, the facts of an answer (tokens, speed, first token,
acceptance, why it stopped), the `< 2/3 >` switcher between alternatives, and its actions (copy;
edit for the user's, regenerate for the last answer)."""

from __future__ import annotations

import json
import re

from PySide6.QtCore import Qt, QTimer, Signal
from PySide6.QtGui import QGuiApplication
from PySide6.QtWidgets import QFrame, QHBoxLayout, QLabel, QToolButton, QVBoxLayout

from app.chat.answer_facts import facts_text
from app.chat.markdown_view import MarkdownView
from app.history.conversation import Message

RENDER_INTERVAL_MS = 50  # a streaming message is re-rendered at most 20 times a second
STATUS_TEXT = {
    "streaming": "",
    "cancelled": "stopped",
    "interrupted": "interrupted",
    "failed": "failed",
    "done": "",
}


class MessageView(QFrame):
    sig_edit_requested = Signal(object)
    """The user wants to edit this message (the Message)."""
    sig_regenerate_requested = Signal()
    """The user wants this answer generated again."""
    sig_alternative_requested = Signal(int, int)
    """The user wants another alternative shown: this message's id, and -1 or +1."""

    def __init__(self, message: Message, parent=None) -> None:
        super().__init__(parent)
        self.message = message
        self._can_switch = True
        self.setObjectName("userMessage" if message.role == "user" else "assistantMessage")
        self.setFrameShape(QFrame.Shape.StyledPanel)

        self.role_label = QLabel("You" if message.role == "user" else "Assistant")
        self.role_label.setObjectName("roleLabel")
        self.status_label = QLabel()
        self.status_label.setObjectName("statusLabel")
        self.copy_button = _tool_button("Copy", "Copy this message as Markdown")
        self.edit_button = _tool_button("Edit", "Edit this message and send it again")
        self.regenerate_button = _tool_button("Regenerate", "Generate this answer again")
        self.previous_button = _tool_button("<", "The answer before this one")
        self.alternative_label = QLabel()
        self.alternative_label.setObjectName("alternativeLabel")
        self.next_button = _tool_button(">", "The answer after this one")
        self.think_button = QToolButton()
        self.think_button.setCheckable(True)
        self.think_button.setToolButtonStyle(Qt.ToolButtonStyle.ToolButtonTextBesideIcon)
        self.think_button.setArrowType(Qt.ArrowType.RightArrow)
        self.think_button.setAutoRaise(True)
        self.reasoning_view = MarkdownView()
        self.reasoning_view.setObjectName("reasoningView")
        self.answer_view = MarkdownView()
        self.error_label = QLabel()
        self.error_label.setObjectName("errorLabel")
        self.error_label.setWordWrap(True)
        self.facts_label = QLabel()
        self.facts_label.setObjectName("factsLabel")
        self.facts_label.setWordWrap(True)

        header = QHBoxLayout()
        header.addWidget(self.role_label)
        header.addWidget(self.status_label)
        header.addStretch(1)
        for widget in (self.previous_button, self.alternative_label, self.next_button):
            header.addWidget(widget)
        for button in (self.copy_button, self.edit_button, self.regenerate_button):
            header.addWidget(button)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(8, 6, 8, 6)
        layout.addLayout(header)
        layout.addWidget(self.think_button, 0, Qt.AlignmentFlag.AlignLeft)
        layout.addWidget(self.reasoning_view)
        layout.addWidget(self.answer_view)
        layout.addWidget(self.error_label)
        layout.addWidget(self.facts_label)
        # only once in the layout: showing a widget without a parent opens it as a window
        self.edit_button.setVisible(message.role == "user")
        for widget in (self.regenerate_button, self.think_button, self.reasoning_view,
                       self.error_label, self.facts_label, self.previous_button,
                       self.alternative_label, self.next_button):
            widget.setVisible(False)

        self._render_timer = QTimer(self)
        self._render_timer.setSingleShot(True)
        self._render_timer.setInterval(RENDER_INTERVAL_MS)
        self._render_timer.timeout.connect(self.render)
        self.copy_button.clicked.connect(self._on_copy_button_clicked)
        self.edit_button.clicked.connect(self._on_edit_button_clicked)
        self.regenerate_button.clicked.connect(self.sig_regenerate_requested)
        self.think_button.toggled.connect(self._on_think_button_toggled)
        self.previous_button.clicked.connect(
            lambda: self.sig_alternative_requested.emit(self.message.id, -1))
        self.next_button.clicked.connect(
            lambda: self.sig_alternative_requested.emit(self.message.id, 1))
        self.render()

    def set_message(self, message: Message) -> None:
        """Show new text or status; while streaming the rendering is throttled."""
        self.message = message
        if message.status == "streaming":
            if not self._render_timer.isActive():
                self._render_timer.start()
        else:
            self._render_timer.stop()
            self.render()

    def set_can_regenerate(self, can_regenerate: bool) -> None:
        self.regenerate_button.setVisible(can_regenerate and self.message.role == "assistant")

    def set_can_switch(self, can_switch: bool) -> None:
        """No switching while this conversation streams an answer."""
        self._can_switch = can_switch
        self.previous_button.setEnabled(can_switch and self.message.alternative > 1)
        self.next_button.setEnabled(
            can_switch and self.message.alternative < self.message.num_alternatives)

    def render(self) -> None:
        m = self.message
        has_alternatives = m.num_alternatives > 1
        for widget in (self.previous_button, self.alternative_label, self.next_button):
            widget.setVisible(has_alternatives)
        self.alternative_label.setText(f"{m.alternative}/{m.num_alternatives}")
        self.set_can_switch(self._can_switch)
        facts = facts_text(m) if m.role == "assistant" else ""
        self.facts_label.setText(facts)
        self.facts_label.setVisible(bool(facts))
        if m.role == "user":
            self.answer_view.set_markdown(m.content)
        else:
            self.answer_view.set_markdown(json_markdown(m.content) if m.is_json else m.content)
            self.reasoning_view.set_markdown(m.reasoning)
            self.think_button.setVisible(bool(m.reasoning))
            self.think_button.setText(thought_text(m))
        self.status_label.setText(STATUS_TEXT.get(m.status, m.status))
        self.error_label.setText(m.error or "")
        self.error_label.setVisible(bool(m.error))

    def _on_copy_button_clicked(self) -> None:
        QGuiApplication.clipboard().setText(self.message.content)

    def _on_edit_button_clicked(self) -> None:
        self.sig_edit_requested.emit(self.message)

    def _on_think_button_toggled(self, is_open: bool) -> None:
        self.think_button.setArrowType(Qt.ArrowType.DownArrow if is_open else
                                       Qt.ArrowType.RightArrow)
        self.reasoning_view.setVisible(is_open)


def thought_text(m: Message) -> str:
    """The folded thinking's title: under way, or how long it is and how long it took."""
    if m.status == "streaming" and m.thinking_s is None:
        return "Thinking…"
    words = f"{len(m.reasoning.split()):,} words"
    return f"Thought for {m.thinking_s:.1f} s ({words})" if m.thinking_s is not None \
        else f"Thought ({words})"


def json_markdown(text: str) -> str:
    """An answer under an output schema as a JSON code block, indented where it is whole JSON
    (a streaming or cut answer shows as it is)."""
    try:
        text = json.dumps(json.loads(text), indent=2, ensure_ascii=False)
    except (ValueError, RecursionError):
        pass
    longest = max((len(run) for run in re.findall(r"`+", text)), default=0)
    fence = "`" * max(3, longest + 1)  # a backtick run inside a string never closes it
    return f"{fence}json\n{text}\n{fence}"


def _tool_button(text: str, tip: str) -> QToolButton:
    button = QToolButton()
    button.setText(text)
    button.setToolTip(tip)
    button.setAutoRaise(True)
    return button
