"""The chat pane: the shown conversation's transcript (or, while it is empty, the welcome
screen), the input box (Enter sends, Shift+Enter a new line; or Ctrl+Enter sends, a setting),
send / stop / regenerate, the context counter and why Send waits. It shows what the
ChatController says and asks it to act."""

from __future__ import annotations

from PySide6.QtCore import QEvent, Qt, Signal
from PySide6.QtGui import QKeySequence, QShortcut
from PySide6.QtWidgets import (
    QHBoxLayout,
    QLabel,
    QPlainTextEdit,
    QPushButton,
    QStackedWidget,
    QVBoxLayout,
    QWidget,
)

from app.chat.chat_controller import ChatController, ContextUsage
from app.chat.message_view import MessageView
from app.chat.welcome_view import WelcomeView
from app.history.conversation import Conversation, Message
from app.widgets.following_scroll_area import FollowingScrollArea

WINDOW = Qt.ShortcutContext.WindowShortcut  # the keys work wherever the focus is in the window
RETURN_KEYS = (Qt.Key.Key_Return, Qt.Key.Key_Enter)


GREEDY_SAME = ("These settings are greedy (temperature 0 or a fixed seed): a regenerated answer "
               "would come out the same.")
# without the reproducible mode a pass's arithmetic depends on how it was cut (a warm cache,
# a prefill chunk, speculation): where two tokens are nearly tied, the answer can turn
GREEDY_NEARLY = ("These settings are greedy (temperature 0 or a fixed seed): a regenerated "
                 "answer would come out nearly the same, not always exactly: where the model's "
                 "top two choices are close, how the answer was computed can tip it. "
                 "\"Reproducible greedy\" in the model picker makes it exact.")

class ChatView(QWidget):
    sig_settings_requested = Signal()
    """The user wants the shown conversation's settings."""
    sig_get_model_requested = Signal()
    """The user wants a real model (from the welcome screen, on the demo model)."""

    def __init__(self, controller: ChatController, parent=None) -> None:
        super().__init__(parent)
        self.controller = controller
        self.message_views: dict[int, MessageView] = {}
        self._editing: Message | None = None
        self.sends_on_ctrl_enter = False  # else Enter sends and Shift+Enter starts a new line

        self.title_label = QLabel()
        self.title_label.setObjectName("conversationTitle")
        self.settings_button = QPushButton("Settings…")
        self.settings_button.setToolTip("System prompt and sampling for this conversation")
        self.transcript = QWidget()
        self.transcript_layout = QVBoxLayout(self.transcript)
        self.transcript_layout.addStretch(1)
        self.scroll_area = FollowingScrollArea()  # follows a streaming answer, as chats do
        self.scroll_area.setWidgetResizable(True)
        self.scroll_area.setWidget(self.transcript)
        self.welcome = WelcomeView()
        self.pages = QStackedWidget()  # the welcome screen while the conversation is empty
        self.pages.addWidget(self.welcome)
        self.pages.addWidget(self.scroll_area)
        self.edit_banner = QLabel()
        self.edit_banner.setObjectName("editBanner")
        self.edit_banner.setWordWrap(True)
        self.edit_banner.setVisible(False)
        self.greedy_banner = QWidget()  # a greedy regenerate would repeat the answer: say so
        self.greedy_banner.setObjectName("greedyBanner")
        self.greedy_label = QLabel(GREEDY_SAME)
        self.greedy_label.setWordWrap(True)
        self.sampling_button = QPushButton("Regenerate with sampling")
        self.sampling_button.setToolTip("This once at temperature 0.8 (or the conversation's "
                                        "own), without the seed")
        self.anyway_button = QPushButton("Regenerate anyway")
        self.greedy_cancel_button = QPushButton("Cancel")
        greedy = QHBoxLayout(self.greedy_banner)
        greedy.setContentsMargins(6, 4, 6, 4)
        greedy.addWidget(self.greedy_label, 1)
        for button in (self.sampling_button, self.anyway_button, self.greedy_cancel_button):
            greedy.addWidget(button)
        self.greedy_banner.setVisible(False)
        self.input = QPlainTextEdit()
        self.input.setObjectName("chatInput")
        self.input.setMaximumHeight(120)
        self.context_label = QLabel()
        self.context_label.setObjectName("contextLabel")
        self.wait_label = QLabel()  # why Send is not possible now: never silently disabled
        self.wait_label.setObjectName("waitLabel")
        self.wait_label.setWordWrap(True)
        self.regenerate_button = QPushButton("Regenerate")
        self.stop_button = QPushButton("Stop")
        self.send_button = QPushButton("Send")
        self.send_button.setDefault(True)

        header = QHBoxLayout()
        header.addWidget(self.title_label, 1)
        header.addWidget(self.settings_button)
        buttons = QHBoxLayout()
        buttons.addWidget(self.context_label)
        buttons.addWidget(self.wait_label, 1)
        for button in (self.regenerate_button, self.stop_button, self.send_button):
            buttons.addWidget(button)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.addLayout(header)
        layout.addWidget(self.pages, 1)
        layout.addWidget(self.edit_banner)
        layout.addWidget(self.greedy_banner)
        layout.addWidget(self.input)
        layout.addLayout(buttons)

        for keys in ("Ctrl+Return", "Ctrl+Enter"):
            shortcut = QShortcut(QKeySequence(keys), self, context=WINDOW)
            shortcut.activated.connect(self._on_send_button_clicked)
        self.input.installEventFilter(self)  # Enter sends, Shift+Enter starts a new line
        escape = QShortcut(QKeySequence("Esc"), self, context=WINDOW)
        escape.activated.connect(self._on_escape_activated)
        self.send_button.clicked.connect(self._on_send_button_clicked)
        self.stop_button.clicked.connect(controller.stop)
        self.regenerate_button.clicked.connect(self._on_regenerate_requested)
        self.settings_button.clicked.connect(self.sig_settings_requested)
        self.sampling_button.clicked.connect(lambda: self._regenerate(with_sampling=True))
        self.anyway_button.clicked.connect(lambda: self._regenerate(with_sampling=False))
        self.greedy_cancel_button.clicked.connect(lambda: self.greedy_banner.setVisible(False))
        self.welcome.sig_prompt_chosen.connect(self._on_welcome_prompt_chosen)
        self.welcome.sig_get_model_requested.connect(self.sig_get_model_requested)
        controller.sig_conversation_shown.connect(self._on_controller_conversation_shown)
        controller.sig_messages_changed.connect(self._on_controller_messages_changed)
        controller.sig_message_updated.connect(self._on_controller_message_updated)
        controller.sig_generating_changed.connect(self._on_controller_generating_changed)
        controller.sig_context_changed.connect(self._on_controller_context_changed)
        self.set_sends_on_ctrl_enter(False)
        self._update_actions()

    def set_sends_on_ctrl_enter(self, on: bool) -> None:
        """Ctrl+Enter sends and Enter starts a new line (on), or Enter sends (off)."""
        self.sends_on_ctrl_enter = on
        keys = "Ctrl+Enter to send" if on else "Enter to send, Shift+Enter for a new line"
        self.input.setPlaceholderText(f"Message ({keys}, Esc to stop)")
        send = "Ctrl+Enter" if on else "Enter"
        self.edit_banner.setText(f"Editing an earlier message: {send} sends it again and "
                                 "replaces what follows; Esc cancels.")

    def eventFilter(self, watched, event) -> bool:  # noqa: N802 (Qt override)
        if (watched is self.input and event.type() == QEvent.Type.KeyPress
                and event.key() in RETURN_KEYS):
            modifiers = event.modifiers() & ~Qt.KeyboardModifier.KeypadModifier
            if modifiers == Qt.KeyboardModifier.NoModifier and not self.sends_on_ctrl_enter:
                self._on_send_button_clicked()
                return True
            if modifiers == Qt.KeyboardModifier.ShiftModifier:
                self.input.textCursor().insertText("\n")  # a plain newline, not U+2028
                return True
        return False

    # ------------------------------------------------------------------ user actions

    def _on_send_button_clicked(self) -> None:
        text = self.input.toPlainText()
        if not self.controller.can_send:
            return  # the wait label says why
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
        if self.controller.regenerate_would_repeat:
            self.greedy_label.setText(GREEDY_SAME if self.controller.reproducible()
                                      else GREEDY_NEARLY)
            self.greedy_banner.setVisible(True)
            return
        self._regenerate(with_sampling=False)

    def _regenerate(self, with_sampling: bool) -> None:
        self.greedy_banner.setVisible(False)
        self.controller.regenerate(with_sampling=with_sampling)

    def _on_welcome_prompt_chosen(self, prompt: str) -> None:
        self.input.setPlainText(prompt)
        self._on_send_button_clicked()

    def _on_message_alternative_requested(self, message_id: int, step: int) -> None:
        self.controller.show_alternative(message_id, step)

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
        self.greedy_banner.setVisible(False)

    def _on_controller_messages_changed(self, messages: list[Message]) -> None:
        for view in self.message_views.values():
            view.deleteLater()
        self.message_views.clear()
        for message in messages:
            view = MessageView(message, self.transcript)
            view.sig_edit_requested.connect(self._on_message_edit_requested)
            view.sig_regenerate_requested.connect(self._on_regenerate_requested)
            view.sig_alternative_requested.connect(self._on_message_alternative_requested)
            self.transcript_layout.insertWidget(self.transcript_layout.count() - 1, view)
            self.message_views[message.id] = view
        self.pages.setCurrentWidget(self.scroll_area if messages else self.welcome)
        self._update_actions()
        self.scroll_area.follow()  # the question just sent (or the chat just opened) in view

    def _on_controller_message_updated(self, message: Message) -> None:
        view = self.message_views.get(message.id)
        if view is None:
            return
        view.set_message(message)  # the scroll area follows the growth if at the bottom

    def _on_controller_generating_changed(self, _is_generating: bool) -> None:
        self._update_actions()

    def _on_controller_context_changed(self, usage: ContextUsage) -> None:
        if usage.total_tokens:
            percent = 100 * usage.used_tokens / usage.total_tokens
            self.context_label.setText(
                f"Context {usage.used_tokens:,} / {usage.total_tokens:,} tokens ({percent:.0f}%)")
        elif usage.has_model:  # an endpoint that does not say its context length
            self.context_label.setText(f"Context {usage.used_tokens:,} tokens")
        else:
            self.context_label.setText("No model loaded")
        self.show_model_state()
        self._update_actions()

    def show_model_state(self) -> None:
        """The welcome screen says what is loaded, or that a load is under way (the window
        calls this once a load has been sent or has failed: the context signal comes first)."""
        self.welcome.show_model(self.controller.loaded,
                                is_loading=self.controller.worker.busy == "load")

    # ------------------------------------------------------------------ helpers

    def _update_actions(self) -> None:
        c = self.controller
        self.send_button.setEnabled(c.can_send)
        reason = c.wait_reason
        self.wait_label.setText(reason if not c.is_generating or reason.startswith("Wait")
                                else "")
        self.send_button.setToolTip(reason or "Send (Ctrl+Enter)" if self.sends_on_ctrl_enter
                                    else reason or "Send (Enter)")
        self.stop_button.setEnabled(c.is_generating)
        has_user_message = any(v.message.role == "user" for v in self.message_views.values())
        self.regenerate_button.setEnabled(c.can_send and has_user_message)
        last = next(reversed(self.message_views.values()), None)
        for view in self.message_views.values():
            view.set_can_regenerate(view is last and c.can_send)
            view.edit_button.setEnabled(c.can_send)
            view.set_can_switch(not (c.is_generating and c.streaming_message is not None
                                     and c.streaming_message.conversation_id
                                     == view.message.conversation_id))
