"""The chat pane: the shown conversation's transcript, the input box, send / stop / regenerate,
and the context-usage counter. It shows what the ChatController says and asks it to act."""

from __future__ import annotations

from PySide6.QtCore import Qt, QTimer, Signal
from PySide6.QtGui import QKeySequence, QShortcut
from PySide6.QtWidgets import (
    QHBoxLayout,
    QLabel,
    QPlainTextEdit,
    QPushButton,
    QScrollArea,
    QVBoxLayout,
    QWidget,
)

from app.chat_controller import ChatController, ContextUsage
from app.conversation import Conversation, Message
from app.message_view import MessageView

WINDOW = Qt.ShortcutContext.WindowShortcut  # the keys work wherever the focus is in the window


class ChatView(QWidget):
    sig_settings_requested = Signal()
    """The user wants the shown conversation's settings."""

    def __init__(self, controller: ChatController, parent=None) -> None:
        super().__init__(parent)
        self.controller = controller
        self.message_views: dict[int, MessageView] = {}
        self._editing: Message | None = None

        self.title_label = QLabel()
        self.title_label.setObjectName("conversationTitle")
        self.settings_button = QPushButton("Settings…")
        self.settings_button.setToolTip("System prompt and sampling for this conversation")
        self.transcript = QWidget()
        self.transcript_layout = QVBoxLayout(self.transcript)
        self.transcript_layout.addStretch(1)
        self.scroll_area = QScrollArea()
        self.scroll_area.setWidgetResizable(True)
        self.scroll_area.setWidget(self.transcript)
        self.edit_banner = QLabel(
            "Editing an earlier message: Ctrl+Enter sends it again and replaces what follows; "
            "Esc cancels.")
        self.edit_banner.setObjectName("editBanner")
        self.edit_banner.setWordWrap(True)
        self.edit_banner.setVisible(False)
        self.input = QPlainTextEdit()
        self.input.setObjectName("chatInput")
        self.input.setPlaceholderText("Message (Ctrl+Enter to send, Esc to stop)")
        self.input.setMaximumHeight(120)
        self.context_label = QLabel()
        self.context_label.setObjectName("contextLabel")
        self.regenerate_button = QPushButton("Regenerate")
        self.stop_button = QPushButton("Stop")
        self.send_button = QPushButton("Send")
        self.send_button.setDefault(True)

        header = QHBoxLayout()
        header.addWidget(self.title_label, 1)
        header.addWidget(self.settings_button)
        buttons = QHBoxLayout()
        buttons.addWidget(self.context_label)
        buttons.addStretch(1)
        for button in (self.regenerate_button, self.stop_button, self.send_button):
            buttons.addWidget(button)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.addLayout(header)
        layout.addWidget(self.scroll_area, 1)
        layout.addWidget(self.edit_banner)
        layout.addWidget(self.input)
        layout.addLayout(buttons)

        for keys in ("Ctrl+Return", "Ctrl+Enter"):
            shortcut = QShortcut(QKeySequence(keys), self, context=WINDOW)
            shortcut.activated.connect(self._on_send_button_clicked)
        escape = QShortcut(QKeySequence("Esc"), self, context=WINDOW)
        escape.activated.connect(self._on_escape_activated)
        self.send_button.clicked.connect(self._on_send_button_clicked)
        self.stop_button.clicked.connect(controller.stop)
        self.regenerate_button.clicked.connect(self._on_regenerate_requested)
        self.settings_button.clicked.connect(self.sig_settings_requested)
        controller.sig_conversation_shown.connect(self._on_controller_conversation_shown)
        controller.sig_messages_changed.connect(self._on_controller_messages_changed)
        controller.sig_message_updated.connect(self._on_controller_message_updated)
        controller.sig_generating_changed.connect(self._on_controller_generating_changed)
        controller.sig_context_changed.connect(self._on_controller_context_changed)
        self._update_actions()

    # ------------------------------------------------------------------ user actions

    def _on_send_button_clicked(self) -> None:
        text = self.input.toPlainText()
        if self._editing is not None:
            is_sent = self.controller.edit_and_resend(self._editing.id, text)
        else:
            is_sent = self.controller.send(text)
        if is_sent:
            self.input.clear()
            self._set_editing(None)

    def _on_escape_activated(self) -> None:
        if self.controller.is_generating:
            self.controller.stop()
        elif self._editing is not None:
            self.input.clear()
            self._set_editing(None)

    def _on_regenerate_requested(self) -> None:
        self.controller.regenerate()

    def _on_message_edit_requested(self, message: Message) -> None:
        self._set_editing(message)
        self.input.setPlainText(message.content)
        self.input.setFocus()

    def _set_editing(self, message: Message | None) -> None:
        self._editing = message
        self.edit_banner.setVisible(message is not None)
        self.send_button.setText("Resend" if message is not None else "Send")

    # ------------------------------------------------------------------ controller

    def _on_controller_conversation_shown(self, conversation: Conversation | None) -> None:
        self.title_label.setText(conversation.title if conversation else "")
        self._set_editing(None)

    def _on_controller_messages_changed(self, messages: list[Message]) -> None:
        for view in self.message_views.values():
            view.deleteLater()
        self.message_views.clear()
        for message in messages:
            view = MessageView(message, self.transcript)
            view.sig_edit_requested.connect(self._on_message_edit_requested)
            view.sig_regenerate_requested.connect(self._on_regenerate_requested)
            self.transcript_layout.insertWidget(self.transcript_layout.count() - 1, view)
            self.message_views[message.id] = view
        self._update_actions()
        self._scroll_to_bottom()

    def _on_controller_message_updated(self, message: Message) -> None:
        view = self.message_views.get(message.id)
        if view is None:
            return
        bar = self.scroll_area.verticalScrollBar()
        is_at_bottom = bar.value() >= bar.maximum() - 4
        view.set_message(message)
        if is_at_bottom:
            self._scroll_to_bottom()

    def _on_controller_generating_changed(self, _is_generating: bool) -> None:
        self._update_actions()

    def _on_controller_context_changed(self, usage: ContextUsage) -> None:
        if usage.total_tokens:
            percent = 100 * usage.used_tokens / usage.total_tokens
            self.context_label.setText(
                f"Context {usage.used_tokens:,} / {usage.total_tokens:,} tokens ({percent:.0f}%)")
        else:
            self.context_label.setText("No model loaded")
        self._update_actions()

    # ------------------------------------------------------------------ helpers

    def _update_actions(self) -> None:
        c = self.controller
        self.send_button.setEnabled(c.can_send)
        self.stop_button.setEnabled(c.is_generating)
        has_user_message = any(v.message.role == "user" for v in self.message_views.values())
        self.regenerate_button.setEnabled(c.can_send and has_user_message)
        last = next(reversed(self.message_views.values()), None)
        for view in self.message_views.values():
            view.set_can_regenerate(view is last and c.can_send)
            view.edit_button.setEnabled(c.can_send)

    def _scroll_to_bottom(self) -> None:
        bar = self.scroll_area.verticalScrollBar()
        QTimer.singleShot(0, self, lambda: bar.setValue(bar.maximum()))
