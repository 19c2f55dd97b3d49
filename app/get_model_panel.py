"""Get a model: paste a Hugging Face repo id, see what would be downloaded and how big it is
(the fit is the picker's FitPanel), then download it with progress, cancel and resume."""

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
    QProgressBar,
    QPushButton,
    QVBoxLayout,
)

from app.hub_download import DownloadProgress
from app.hub_listing import RepoListing
from app.model_download import ModelDownload

MAX_FILES_NAMED = 4


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
        self.repo_edit.setPlaceholderText("org/name, e.g. Qwen/Qwen2.5-0.5B-Instruct")
        self.check_button = QPushButton("Check")
        self.info_label = QLabel("Paste a repo id to see its size and whether it fits.")
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
        layout.addWidget(self.info_label)
        layout.addLayout(actions)

        self.repo_edit.installEventFilter(self)  # Return checks the repo id
        self.check_button.clicked.connect(self._on_check_button_clicked)
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
        if self.download.is_busy or not self.repo_edit.text().strip():
            return
        self.download.listing = None
        self.info_label.setText(f"Asking the Hub about {self.repo_edit.text().strip()}…")
        self.progress_bar.setValue(0)
        self.download.check(self.repo_edit.text())

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


def size_text(num_bytes: float) -> str:
    """Decimal units, as the Hub's pages write them: 824 kB, 15.2 MB, 1.54 GB."""
    for unit, scale, digits in (("GB", 1e9, 2), ("MB", 1e6, 1), ("kB", 1e3, 0)):
        if num_bytes >= scale:
            return f"{num_bytes / scale:.{digits}f} {unit}"
    return f"{num_bytes:.0f} B"


def _duration(seconds: float) -> str:
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 5400:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"
