"""Get a model: search the Hugging Face Hub by keyword (downloads and size of each result) or
paste a repo id, see what would be downloaded and how big it is (the fit per format is the
picker's FitPanel), then download it with progress, cancel and resume."""

from __future__ import annotations

import html
import time
from pathlib import Path

from PySide6.QtCore import QEvent, Qt, Signal
from PySide6.QtWidgets import (
    QGroupBox,
    QHBoxLayout,
    QLabel,
    QLineEdit,
    QListWidget,
    QListWidgetItem,
    QProgressBar,
    QPushButton,
    QVBoxLayout,
)

from app.get_model.hub_search import HubModel
from app.get_model.model_download import ModelDownload
from engine.files.hub_download import DownloadProgress
from engine.files.hub_listing import HubError, RepoListing, parse_repo_id
from engine.files.model_catalog import count_text, size_text

MAX_FILES_NAMED = 4
MODEL_ROLE = Qt.ItemDataRole.UserRole
RESULTS_HEIGHT = 130


class GetModelPanel(QGroupBox):
    sig_listing_shown = Signal(object)
    """A repo was checked: its RepoListing (the picker shows whether it fits)."""
    sig_downloaded = Signal(object)
    """A download finished: the snapshot folder (Path), now in the local cache."""

    def __init__(self, download: ModelDownload, parent=None) -> None:
        super().__init__("Get a model from Hugging Face", parent)
        self.download = download
        self._rate_start: tuple[float, int] | None = None  # (time, bytes) this try began at

        self.repo_edit = QLineEdit()
        self.repo_edit.setPlaceholderText("search, e.g. qwen instruct, or paste org/name")
        self.check_button = QPushButton("Search")
        self.results = QListWidget()  # the Hub's models for the words typed
        self.results.setMaximumHeight(RESULTS_HEIGHT)
        self.results.setVisible(False)
        self.info_label = QLabel("Search the Hub by keyword, or paste a repo id, to see a "
                                 "model's size and whether it fits.")
        self.info_label.setWordWrap(True)
        self.progress_bar = QProgressBar()
        self.progress_bar.setRange(0, 1000)
        self.download_button = QPushButton("Download")
        self.cancel_button = QPushButton("Cancel")
        row = QHBoxLayout()
        row.addWidget(self.repo_edit, 1)
        row.addWidget(self.check_button)
        actions = QHBoxLayout()
        actions.addWidget(self.progress_bar, 1)
        actions.addWidget(self.download_button)
        actions.addWidget(self.cancel_button)
        layout = QVBoxLayout(self)
        layout.addLayout(row)
        layout.addWidget(self.results)
        layout.addWidget(self.info_label)
        layout.addLayout(actions)

        self.repo_edit.installEventFilter(self)  # Return checks the repo id
        self.check_button.clicked.connect(self._on_check_button_clicked)
        self.repo_edit.textChanged.connect(self._on_repo_edit_text_changed)
        self.results.itemClicked.connect(self._on_results_item_clicked)
        download.sig_found.connect(self._on_download_found)
        self.download_button.clicked.connect(self._on_download_button_clicked)
        self.cancel_button.clicked.connect(download.cancel)
        download.sig_listed.connect(self._on_download_listed)
        download.sig_progress.connect(self._on_download_progress)
        download.sig_downloaded.connect(self._on_download_downloaded)
        download.sig_failed.connect(self._on_download_failed)
        download.sig_cancelled.connect(self._on_download_cancelled)
        download.sig_busy_changed.connect(self._update_actions)
        if download.listing is not None:  # reopened while a download runs, or after a check
            self.repo_edit.setText(download.listing.repo_id)
            self.info_label.setText(describe(download.listing))
        if download.progress is not None and download.job == "download":
            self._on_download_progress(download.progress)
        self._update_actions()

    @property
    def listing(self) -> RepoListing | None:
        return self.download.listing

    def eventFilter(self, watched, event) -> bool:  # noqa: N802 (Qt override)
        """Return in the repo id box checks the repo, and goes no further: in a dialog it would
        press the default button (Load) too."""
        if (watched is self.repo_edit and event.type() == QEvent.Type.KeyPress
                and event.key() in (Qt.Key.Key_Return, Qt.Key.Key_Enter)):
            self._on_check_button_clicked()
            return True
        return False

    # ------------------------------------------------------------------ user actions

    def _on_check_button_clicked(self) -> None:
        text = self.repo_edit.text().strip()
        if self.download.is_busy or not text:
            return
        if not _is_repo_id(text):
            self.info_label.setText(f"Searching the Hub for {html.escape(text)}…")
            self.download.search(text)
            return
        self._check(text)

    def _check(self, repo_text: str) -> None:
        self.download.listing = None
        self.info_label.setText(f"Asking the Hub about {html.escape(repo_text)}…")
        self.progress_bar.setValue(0)
        self.download.check(repo_text)

    def _on_repo_edit_text_changed(self, text: str) -> None:
        self.check_button.setText("Check" if _is_repo_id(text.strip()) else "Search")

    def _on_results_item_clicked(self, item: QListWidgetItem) -> None:
        if not self.download.is_busy:
            self._check(item.data(MODEL_ROLE).repo_id)

    def _on_download_found(self, models: tuple[HubModel, ...]) -> None:
        self.results.clear()
        for model in models:
            item = QListWidgetItem(result_text(model))
            item.setData(MODEL_ROLE, model)
            item.setToolTip(f"{model.repo_id}: choose it to see its files and the fit per "
                            "format")
            self.results.addItem(item)
        self.results.setVisible(bool(models))
        query = html.escape(self.repo_edit.text().strip())
        self.info_label.setText(
            f"{len(models)} models with safetensors weights match {query}, most downloaded "
            "first: choose one to see its files and whether it fits." if models else
            f"No model with safetensors weights on the Hub matches {query}.")

    def _on_download_button_clicked(self) -> None:
        if self.listing is not None and not self.download.is_busy:
            self._rate_start = None
            self.download.download(self.listing)

    # ------------------------------------------------------------------ download

    def _on_download_listed(self, listing: RepoListing) -> None:
        self.info_label.setText(describe(listing))
        self._update_actions()
        self.sig_listing_shown.emit(listing)

    def _on_download_progress(self, p: DownloadProgress) -> None:
        now = time.monotonic()
        if self._rate_start is None:
            self._rate_start = (now, p.done_bytes)
        t0, b0 = self._rate_start
        rate = (p.done_bytes - b0) / (now - t0) if now > t0 else 0.0
        left = f" · about {_duration((p.total_bytes - p.done_bytes) / rate)} left" if rate else ""
        self.progress_bar.setValue(int(1000 * p.done_bytes / max(p.total_bytes, 1)))
        self.info_label.setText(
            f"Downloading {self.listing.repo_id if self.listing else ''}: "
            f"{size_text(p.done_bytes)} of {size_text(p.total_bytes)} · file {p.num_files_done + 1}"
            f" of {p.num_files} ({p.file_name}) · {rate / 1e6:.1f} MB/s{left}")

    def _on_download_downloaded(self, snapshot: Path) -> None:
        self.progress_bar.setValue(1000)
        self.info_label.setText(f"Downloaded {self.listing.repo_id} into {snapshot}.")
        self.sig_downloaded.emit(snapshot)

    def _on_download_failed(self, message: str) -> None:
        # the message may quote what a server sent: shown as text, never as markup
        self.info_label.setText(
            f"<span style='color:#c62828'>{html.escape(message, quote=False)}</span>")

    def _on_download_cancelled(self) -> None:
        self.info_label.setText("Download stopped. What arrived is kept: Download continues "
                                "from there.")

    def _update_actions(self, _busy: bool = False) -> None:
        busy = self.download.is_busy
        listing = self.listing
        self.check_button.setEnabled(not busy)
        self.results.setEnabled(not busy)
        self.repo_edit.setReadOnly(busy)
        self.download_button.setEnabled(not busy and listing is not None and listing.is_supported)
        self.cancel_button.setEnabled(self.download.job == "download")
        self.progress_bar.setVisible(self.download.job == "download" or
                                     self.progress_bar.value() > 0)


def describe(listing: RepoListing) -> str:
    """Size and files before downloading, e.g. '1.54 GB in 6 files: model.safetensors …'."""
    # names come from the server: escaped, so that they show as text and never as markup
    named = ", ".join(f"{html.escape(f.name)} ({size_text(f.size)})"
                      for f in listing.files[:MAX_FILES_NAMED])
    more = len(listing.files) - MAX_FILES_NAMED
    named += f" and {more} more" if more > 0 else ""
    skipped = (f"; {listing.num_skipped_files} other files (other formats) are left out"
               if listing.num_skipped_files else "")
    support = "" if listing.is_supported else (
        f"<br><span style='color:#c62828'>{html.escape(str(listing.architecture))} is not an "
        "architecture Hearth runs, so it is not offered for download.</span>")
    return (f"<b>{listing.repo_id}</b>: {size_text(listing.total_bytes)} to download in "
            f"{len(listing.files)} files: {named}{skipped}.{support}")


def result_text(model: HubModel) -> str:
    """'Qwen/Qwen2.5-0.5B-Instruct · 1.2M downloads · 494M parameters · 0.99 GB in BF16'."""
    parts = [model.repo_id, f"{count_text(model.downloads)} downloads"]
    if model.num_params:
        parts.append(f"{count_text(model.num_params)} parameters")
    if model.weights_bytes:
        parts.append(f"{size_text(model.weights_bytes)} in {'/'.join(model.dtypes[:2])}")
    return " · ".join(parts)


def _is_repo_id(text: str) -> bool:
    try:
        parse_repo_id(text)
    except HubError:
        return False
    return True


def _duration(seconds: float) -> str:
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 5400:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"
