"""The sidebar: conversations, newest first; new, rename (double-click), settings, delete."""

from __future__ import annotations

from PySide6.QtCore import Qt, Signal
from PySide6.QtWidgets import QListWidget, QListWidgetItem, QMenu, QPushButton, QVBoxLayout, QWidget

from app.chat_controller import ChatController
from app.conversation import Conversation

ID_ROLE = Qt.ItemDataRole.UserRole


class ConversationListView(QWidget):
    sig_settings_requested = Signal(object)
    """The user wants a conversation's settings (its id)."""

    def __init__(self, controller: ChatController, parent=None) -> None:
        super().__init__(parent)
        self.controller = controller
        self.new_button = QPushButton("New chat")
        self.list = QListWidget()
        self.list.setContextMenuPolicy(Qt.ContextMenuPolicy.CustomContextMenu)
        self.list.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)  # elide
        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.addWidget(self.new_button)
        layout.addWidget(self.list, 1)
        self._is_refreshing = False
        self.new_button.clicked.connect(self._on_new_button_clicked)
        self.list.currentItemChanged.connect(self._on_list_current_item_changed)
        self.list.itemChanged.connect(self._on_list_item_changed)
        self.list.customContextMenuRequested.connect(self._on_list_context_menu_requested)
        controller.sig_conversations_changed.connect(self.refresh)
        controller.sig_conversation_shown.connect(self._on_controller_conversation_shown)
        self.refresh()

    def refresh(self) -> None:
        self._is_refreshing = True
        shown = self.controller.conversation.id if self.controller.conversation else None
        self.list.clear()
        for conversation in self.controller.conversations():
            item = QListWidgetItem(conversation.title)
            item.setData(ID_ROLE, conversation.id)
            item.setFlags(item.flags() | Qt.ItemFlag.ItemIsEditable)
            self.list.addItem(item)
            if conversation.id == shown:
                self.list.setCurrentItem(item)
        self._is_refreshing = False

    def _on_new_button_clicked(self) -> None:
        self.controller.new_conversation()

    def _on_list_current_item_changed(self, item: QListWidgetItem | None, _previous) -> None:
        if self._is_refreshing or item is None:
            return
        cid = item.data(ID_ROLE)
        if self.controller.conversation is None or self.controller.conversation.id != cid:
            self.controller.show_conversation(cid)

    def _on_list_item_changed(self, item: QListWidgetItem) -> None:
        if not self._is_refreshing:
            self.controller.rename_conversation(item.data(ID_ROLE), item.text())

    def _on_list_context_menu_requested(self, pos) -> None:
        item = self.list.itemAt(pos)
        if item is None:
            return
        cid = item.data(ID_ROLE)
        menu = QMenu(self)
        menu.addAction("Rename", lambda: self.list.editItem(item))
        menu.addAction("Settings…", lambda: self.sig_settings_requested.emit(cid))
        menu.addAction("Delete", lambda: self.controller.delete_conversation(cid))
        menu.popup(self.list.viewport().mapToGlobal(pos))

    def _on_controller_conversation_shown(self, conversation: Conversation | None) -> None:
        if conversation is None:
            return
        for row in range(self.list.count()):
            item = self.list.item(row)
            if item.data(ID_ROLE) == conversation.id:
                self._is_refreshing = True
                item.setText(conversation.title)
                self.list.setCurrentItem(item)
                self._is_refreshing = False
                return
        self.refresh()
