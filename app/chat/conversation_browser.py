"""Which conversation is shown, and the list of them: showing, creating, renaming, settings.
ChatController (chat_controller.py) adds the answering; no widgets here either."""

from __future__ import annotations

import dataclasses

from PySide6.QtCore import QObject, Signal

from app.history.conversation import DEFAULT_TITLE, ChatSettings, Conversation, Message
from app.history.conversation_store import ConversationStore


class ConversationBrowser(QObject):
    """The shown conversation of a store; a subclass gives `messages()` and `_emit_context()`."""

    sig_conversations_changed = Signal()
    """Conversations were added, removed, renamed or reordered."""
    sig_conversation_shown = Signal(object)
    """Another conversation is shown: its Conversation, or None when there is none."""
    sig_messages_changed = Signal(object)
    """The shown conversation's message list changed: the list of Message."""

    def __init__(self, store: ConversationStore, parent: QObject | None = None) -> None:
        super().__init__(parent)
        self.store = store
        self.conversation: Conversation | None = None

    @property
    def regenerate_would_repeat(self) -> bool:
        """Greedy decoding (temperature 0) or a fixed seed, and a whole answer to repeat: a
        regenerated answer would come out the same as the one before (a stopped or failed one
        would not: it goes on past where that one ended)."""
        if self.conversation is None:
            return False
        settings = self.conversation.settings
        path = self.store.messages(self.conversation.id)
        is_whole = bool(path) and path[-1].role == "assistant" and path[-1].status == "done"
        return is_whole and (settings.temperature == 0 or settings.seed is not None)

    def reproducible(self) -> bool:
        """The loaded model runs the reproducible mode (its Loaded event's config says): a
        greedy answer comes out the same however it was computed. `loaded` is the chat
        controller's last Loaded."""
        loaded = getattr(self, "loaded", None)
        return bool(loaded is not None and (loaded.config or {}).get("reproducible"))

    def conversations(self) -> list[Conversation]:
        return self.store.conversations()

    def show_conversation(self, conversation_id: int | None) -> None:
        self.conversation = (self.store.conversation(conversation_id)
                             if conversation_id is not None else None)
        self.sig_conversation_shown.emit(self.conversation)
        self.sig_messages_changed.emit(self.messages())
        self._emit_context()

    def show_latest_or_new(self) -> None:
        """At start-up: the most recent conversation, or a new one."""
        conversations = self.store.conversations()
        if conversations:
            self.show_conversation(conversations[0].id)
        else:
            self.new_conversation()

    def new_conversation(self, settings: ChatSettings | None = None) -> Conversation:
        """A new conversation with `settings`, else the shown one's (its output schema is its
        own: a new chat answers in free text)."""
        base = settings or (dataclasses.replace(self.conversation.settings, output_schema="")
                            if self.conversation else None)
        conversation = self.store.create_conversation(settings=base)
        self.sig_conversations_changed.emit()
        self.show_conversation(conversation.id)
        return conversation

    def rename_conversation(self, conversation_id: int, title: str) -> None:
        self.store.rename_conversation(conversation_id, title.strip() or DEFAULT_TITLE)
        self._reload_conversation(conversation_id)
        self.sig_conversations_changed.emit()

    def update_settings(self, conversation_id: int, settings: ChatSettings) -> None:
        self.store.update_settings(conversation_id, settings)
        self._reload_conversation(conversation_id)

    def _is_shown(self, message: Message) -> bool:
        return self.conversation is not None and message.conversation_id == self.conversation.id

    def _reload_conversation(self, conversation_id: int) -> None:
        if self.conversation is not None and self.conversation.id == conversation_id:
            self.conversation = self.store.conversation(conversation_id)
            self.sig_conversation_shown.emit(self.conversation)
