"""Searching the Hub, checking and downloading a Hugging Face repo off the GUI thread: one job
at a time on a daemon thread (quitting never waits for a download), its results collected by a
GUI-thread timer, so no signal crosses threads. Progress is read at the timer's pace, not per
chunk."""

from __future__ import annotations

import logging
import threading
from pathlib import Path

from PySide6.QtCore import QObject, QTimer, Signal

from app.get_model.hub_search import search_models
from engine.files import hub_download
from engine.files.hub_download import DownloadCancelled, DownloadProgress
from engine.files.hub_listing import HubError, RepoListing, fetch_listing
from engine.files.model_home import hub_cache_dir

log = logging.getLogger("hearth.download")
POLL_INTERVAL_MS = 100


class ModelDownload(QObject):
    sig_found = Signal(object)
    """A search's results: a tuple of HubModel, most downloaded first (maybe empty)."""
    sig_listed = Signal(object)
    """A RepoListing: the repo's files, their sizes and its config, nothing downloaded yet."""
    sig_progress = Signal(object)
    """A DownloadProgress, a few times a second while downloading."""
    sig_downloaded = Signal(object)
    """The snapshot folder (Path) of a finished download."""
    sig_failed = Signal(str)
    """One sentence: why the check or the download stopped."""
    sig_cancelled = Signal()
    """The download stopped when asked; what arrived is kept and the next try continues it."""
    sig_busy_changed = Signal(bool)
    """A check or a download started (True) or ended (False)."""

    def __init__(self, cache_dir: Path | None = None, parent: QObject | None = None) -> None:
        super().__init__(parent)
        self.cache_dir = cache_dir
        self.job: str | None = None  # "search", "check" or "download" while one runs
        self.listing: RepoListing | None = None  # the last repo checked or being downloaded
        self.progress: DownloadProgress | None = None
        self._cancel = threading.Event()
        self._outcome: tuple[str, object] | None = None  # set once by the job's thread
        self._shown_progress: DownloadProgress | None = None
        self._timer = QTimer(self)
        self._timer.setInterval(POLL_INTERVAL_MS)
        self._timer.timeout.connect(self._on_timer_timeout)

    @property
    def is_busy(self) -> bool:
        return self.job is not None

    def search(self, query: str) -> None:
        """Search the Hub by keyword; sig_found or sig_failed follows."""
        self._start("search", lambda: search_models(query))

    def check(self, repo_text: str) -> None:
        """List the repo and read its config.json; sig_listed or sig_failed follows."""
        self._start("check", lambda: fetch_listing(repo_text))

    def download(self, listing: RepoListing) -> None:
        """Fetch the listing's files into the cache; sig_downloaded, sig_failed or
        sig_cancelled follows."""
        self.listing = listing
        self.progress = DownloadProgress(0, listing.total_bytes, "", 0, len(listing.files))
        cache = self.cache_dir or hub_cache_dir()
        self._start("download", lambda: hub_download.download(
            listing, cache, self._set_progress, self._cancel.is_set))

    def cancel(self) -> None:
        """Stop the running download at its next chunk (a check just finishes)."""
        self._cancel.set()

    # ------------------------------------------------------------------ thread side

    def _start(self, job: str, work) -> None:
        if self.job is not None:
            raise RuntimeError(f"a {self.job} is running; wait for it or cancel it")
        self.job = job
        self._cancel.clear()
        self._outcome = None

        def run() -> None:
            try:
                outcome = ("done", work())
            except DownloadCancelled:
                outcome = ("cancelled", None)
            except HubError as e:
                outcome = ("failed", str(e))
            except Exception as e:  # a bug must still end the job in the window, not a console
                log.exception("%s failed", job)
                outcome = ("failed", f"unexpected {type(e).__name__}: {e}")
            self._outcome = outcome  # one assignment: the GUI thread sees all of it or none

        threading.Thread(target=run, name=f"hearth-{job}", daemon=True).start()
        self._timer.start()
        self.sig_busy_changed.emit(True)

    def _set_progress(self, progress: DownloadProgress) -> None:
        self.progress = progress  # read by the GUI thread's timer

    # ------------------------------------------------------------------ GUI side

    def _on_timer_timeout(self) -> None:
        progress = self.progress
        if self.job == "download" and progress is not self._shown_progress:
            self._shown_progress = progress
            self.sig_progress.emit(progress)
        outcome = self._outcome
        if outcome is None:
            return
        self._timer.stop()
        job, self.job, self._outcome = self.job, None, None
        kind, value = outcome
        log.info("%s ended: %s %s", job, kind, value if kind == "failed" else "")
        self.sig_busy_changed.emit(False)
        if kind == "failed":
            self.sig_failed.emit(value)
        elif kind == "cancelled":
            self.sig_cancelled.emit()
        elif job == "search":
            self.sig_found.emit(value)
        elif job == "check":
            self.listing = value
            self.sig_listed.emit(value)
        else:
            self.sig_downloaded.emit(value)
