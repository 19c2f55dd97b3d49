"""The picker's endpoints: each OpenAI-compatible endpoint added (its key shown masked) with the
models its /models lists; choosing one of them is the picker's remote choice. "Add endpoint…"
opens EndpointDialog; a keyring that cannot keep the key is said here."""

from __future__ import annotations

from PySide6.QtCore import Qt, Signal
from PySide6.QtWidgets import (
    QHBoxLayout,
    QLabel,
    QPushButton,
    QTreeWidget,
    QTreeWidgetItem,
    QVBoxLayout,
    QWidget,
)

from app.remote.endpoint_dialog import EndpointDialog
from app.remote.endpoint_listing import EndpointListing, Listing
from app.remote.endpoints import EndpointBook, EndpointModel
from engine.remote import mask

MODEL_ROLE = Qt.ItemDataRole.UserRole  # an EndpointModel on a model's row
URL_ROLE = Qt.ItemDataRole.UserRole + 1  # the base URL on every row


class EndpointPanel(QWidget):
    sig_model_chosen = Signal(object)
    """An EndpointModel the user chose, or None when no remote model is chosen any more."""

    def __init__(self, book: EndpointBook, listing: EndpointListing | None = None,
                 parent=None) -> None:
        super().__init__(parent)
        self.book = book
        self.listing = listing or EndpointListing(self)
        self.dialog: EndpointDialog | None = None
        self._items: dict[str, QTreeWidgetItem] = {}

        self.tree = QTreeWidget()
        self.tree.setHeaderHidden(True)
        self.tree.setMaximumHeight(160)
        self.add_button = QPushButton("Add endpoint…")
        self.remove_button = QPushButton("Remove endpoint")
        self.status_label = QLabel()
        self.status_label.setWordWrap(True)
        self.status_label.setVisible(False)
        row = QHBoxLayout()
        row.addWidget(self.add_button)
        row.addWidget(self.remove_button)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.addWidget(QLabel("Endpoints (OpenAI-compatible, e.g. vLLM on a cluster)"))
        layout.addWidget(self.tree)
        layout.addLayout(row)
        layout.addWidget(self.status_label)

        self.tree.currentItemChanged.connect(self._on_tree_current_item_changed)
        self.add_button.clicked.connect(self.open_add_dialog)
        self.remove_button.clicked.connect(self._on_remove_button_clicked)
        self.listing.sig_listed.connect(self._on_listing_listed)
        for url in book.urls():
            self._show_endpoint(url)
        self._update_buttons()

    # ------------------------------------------------------------------ public

    def chosen(self) -> EndpointModel | None:
        item = self.tree.currentItem()
        return item.data(0, MODEL_ROLE) if item is not None else None

    def clear_choice(self) -> None:
        """Another kind of model was chosen in the picker: no signal back."""
        self.tree.blockSignals(True)
        self.tree.setCurrentItem(None)
        self.tree.blockSignals(False)
        self._update_buttons()

    def open_add_dialog(self) -> EndpointDialog:
        self.dialog = EndpointDialog(self)
        self.dialog.accepted.connect(self._on_dialog_accepted)
        self.dialog.open()
        return self.dialog

    def add_endpoint(self, url: str, api_key: str | None) -> str:
        """Save it (the key in the keyring) and list its models; its normalized URL."""
        base = self.book.add(url, api_key)
        self._show_endpoint(base)
        notice = self.book.keys.notice if api_key else ""
        self.status_label.setText(notice)
        self.status_label.setVisible(bool(notice))
        return base

    # ------------------------------------------------------------------ slots

    def _on_dialog_accepted(self) -> None:
        dialog = self.dialog
        self.add_endpoint(dialog.base_url(), dialog.api_key())
        dialog.key_edit.clear()  # the widget lives on until Qt deletes it: keep no copy there

    def _on_remove_button_clicked(self) -> None:
        item = self.tree.currentItem()
        if item is None:
            return
        url = item.data(0, URL_ROLE)
        self.book.remove(url)
        top = self._items.pop(url)
        self.tree.takeTopLevelItem(self.tree.indexOfTopLevelItem(top))
        self._update_buttons()

    def _on_tree_current_item_changed(self, item, _previous) -> None:
        self._update_buttons()
        self.sig_model_chosen.emit(item.data(0, MODEL_ROLE) if item is not None else None)

    def _on_listing_listed(self, listing: Listing) -> None:
        top = self._items.get(listing.base_url)
        if top is None:
            return  # removed meanwhile
        was_chosen = self.chosen()
        top.takeChildren()
        if listing.error:
            self._add_child(top, f"Could not list its models: {listing.error}", None)
        elif not listing.models:
            self._add_child(top, "It lists no models.", None)
        for m in listing.models:
            context = f"  ({m.context:,} tokens)" if m.context else ""
            choice = EndpointModel(listing.base_url, m.id, m.context)
            child = self._add_child(top, m.id + context, choice)
            if was_chosen is not None and was_chosen.model == m.id:
                self.tree.setCurrentItem(child)
        top.setExpanded(True)

    # ------------------------------------------------------------------ helpers

    def _show_endpoint(self, url: str) -> None:
        key = self.book.key(url)
        text = f"{url}  · key {mask(key)}" if key else f"{url}  · no key"
        top = self._items.get(url)
        if top is None:
            top = QTreeWidgetItem([text])
            top.setData(0, URL_ROLE, url)
            top.setFlags(Qt.ItemFlag.ItemIsEnabled | Qt.ItemFlag.ItemIsSelectable)
            self.tree.addTopLevelItem(top)
            self._items[url] = top
        top.setText(0, text)
        top.takeChildren()
        self._add_child(top, "Listing its models…", None)
        top.setExpanded(True)
        self.listing.fetch(url, key)

    def _add_child(self, top: QTreeWidgetItem, text: str,
                   choice: EndpointModel | None) -> QTreeWidgetItem:
        child = QTreeWidgetItem([text])
        child.setData(0, URL_ROLE, top.data(0, URL_ROLE))
        child.setData(0, MODEL_ROLE, choice)
        child.setToolTip(0, text)
        if choice is None:
            child.setFlags(Qt.ItemFlag.ItemIsEnabled)  # a note, not a choice
        top.addChild(child)
        return child

    def _update_buttons(self) -> None:
        self.remove_button.setEnabled(self.tree.currentItem() is not None)
