"""The sidebar: conversations, newest first; new, rename (double-click), settings, delete;
search across all of them (full text); export one as Markdown or JSON, import a JSON one (a file
that cannot be taken is refused in one sentence, below the list, and nothing of it is kept)."""

from __future__ import annotations

from pathlib import Path

from PySide6.QtCore import Qt, Signal
from PySide6.QtWidgets import (
    QFileDialog,
    QHBoxLayout,
    QLabel,
    QLineEdit,
    QListWidget,
    QListWidgetItem,
    QMenu,
    QPushButton,
    QVBoxLayout,
    QWidget,
)

from app.chat import conversation_export
from app.chat.chat_controller import ChatController
from app.chat.conversation_export import ImportRefused
from app.history.conversation import ChatSettings, Conversation

ID_ROLE = Qt.ItemDataRole.UserRole


class ConversationListView(QWidget):
    sig_settings_requested = Signal(object)
    """The user wants a conversation's settings (its id)."""

    def __init__(self, controller: ChatController, parent=None) -> None:
        super().__init__(parent)
        self.controller = controller
        self.new_button = QPushButton("New chat")
        self.import_button = QPushButton("Import…")
        self.import_button.setToolTip("A conversation exported as JSON (OpenAI's message format)")
        self.search_edit = QLineEdit()
        self.search_edit.setPlaceholderText("Search conversations")
        self.search_edit.setClearButtonEnabled(True)
        self.message_label = QLabel()  # what an import or export could not do, or did
        self.message_label.setObjectName("errorLabel")
        self.message_label.setWordWrap(True)
        self.message_label.setVisible(False)
        self.list = QListWidget()
        self.list.setContextMenuPolicy(Qt.ContextMenuPolicy.CustomContextMenu)
        self.list.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)  # elide
        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        buttons = QHBoxLayout()
        buttons.addWidget(self.new_button, 1)
        buttons.addWidget(self.import_button)
        layout.addLayout(buttons)
        layout.addWidget(self.search_edit)
        layout.addWidget(self.list, 1)
        layout.addWidget(self.message_label)
        self._is_refreshing = False
        self.new_button.clicked.connect(self._on_new_button_clicked)
        self.import_button.clicked.connect(self._on_import_button_clicked)
        self.search_edit.textChanged.connect(self.refresh)
        self.list.currentItemChanged.connect(self._on_list_current_item_changed)
        self.list.itemChanged.connect(self._on_list_item_changed)
        self.list.customContextMenuRequested.connect(self._on_list_context_menu_requested)
        controller.sig_conversations_changed.connect(self.refresh)
        controller.sig_conversation_shown.connect(self._on_controller_conversation_shown)
        self.refresh()

    def refresh(self) -> None:
        """All conversations, or those the search box's words find."""
        self._is_refreshing = True
        shown = self.controller.conversation.id if self.controller.conversation else None
        self.list.clear()
        query = self.search_edit.text().strip()
        if query:
            found = [(h.conversation, h.snippet) for h in self.controller.store.search(query)]
        else:
            found = [(c, "") for c in self.controller.conversations()]
        for conversation, snippet in found:
            item = QListWidgetItem(conversation.title + (f"\n{snippet}" if snippet else ""))
            item.setToolTip(snippet or conversation.title)
            item.setData(ID_ROLE, conversation.id)
            if not query:  # a search hit's text is not its title: not renamed in place
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
        menu.addAction("Export as Markdown…", lambda: self._ask_export(cid, "md"))
        menu.addAction("Export as JSON…", lambda: self._ask_export(cid, "json"))
        menu.addAction("Delete", lambda: self.controller.delete_conversation(cid))
        menu.popup(self.list.viewport().mapToGlobal(pos))

    # ------------------------------------------------------------------ export, import

    def export_conversation(self, conversation_id: int, path: Path, kind: str) -> bool:
        """Write the conversation as shown to `path` ("md" or "json")."""
        conversation = self.controller.store.conversation(conversation_id)
        if conversation is None:
            return False
        messages = self.controller.store.messages(conversation_id)
        write = conversation_export.to_markdown if kind == "md" else conversation_export.to_json
        try:
            Path(path).write_text(write(conversation, messages), encoding="utf-8")
        except OSError as e:
            return self._say(f"Could not write {path}: {e.strerror or e}.")
        return self._say(f"Exported \u201c{conversation.title}\u201d to {path}.", ok=True)

    def import_file(self, path: Path) -> Conversation | None:
        """Import a JSON conversation and show it; refused in one sentence, nothing kept."""
        path = Path(path)
        try:
            with path.open("rb") as f:  # read no more than a conversation can be
                data = f.read(conversation_export.MAX_IMPORT_BYTES + 1)
            imported = conversation_export.parse_json(data, path.name)
        except OSError as e:
            self._say(f"Could not read {path.name}: {e.strerror or e}.")
            return None
        except ImportRefused as e:
            self._say(f"Not imported: {e}.")
            return None
        conversation = self.controller.store.import_conversation(
            imported.title, ChatSettings(system_prompt=imported.system_prompt),
            imported.messages)
        self.search_edit.clear()
        self.controller.show_conversation(conversation.id)
        self.refresh()
        self._say(f"Imported \u201c{conversation.title}\u201d "
                  f"({len(imported.messages)} messages).", ok=True)
        return conversation

    def _ask_export(self, conversation_id: int, kind: str) -> None:
        conversation = self.controller.store.conversation(conversation_id)
        name = "".join(c if c.isalnum() or c in " -_" else "_" for c in conversation.title)
        path, _ = QFileDialog.getSaveFileName(
            self, "Export the conversation", f"{name.strip() or 'chat'}.{kind}",
            "Markdown (*.md)" if kind == "md" else "JSON (*.json)")
        if path:
            self.export_conversation(conversation_id, Path(path), kind)

    def _on_import_button_clicked(self) -> None:
        path, _ = QFileDialog.getOpenFileName(self, "Import a conversation", "",
                                              "JSON (*.json);;All files (*)")
        if path:
            self.import_file(Path(path))

    def _say(self, text: str, ok: bool = False) -> bool:
        self.message_label.setText(text)
        self.message_label.setObjectName("infoLabel" if ok else "errorLabel")
        self.message_label.style().unpolish(self.message_label)
        self.message_label.style().polish(self.message_label)
        self.message_label.setVisible(True)
        return ok

    def _on_controller_conversation_shown(self, conversation: Conversation | None) -> None:
        if conversation is None:
            return
        if self.search_edit.text().strip():
            return  # the hits stay as found
        for row in range(self.list.count()):
            item = self.list.item(row)
            if item.data(ID_ROLE) == conversation.id:
                self._is_refreshing = True
                item.setText(conversation.title)
                self.list.setCurrentItem(item)
                self._is_refreshing = False
                return
        self.refresh()
