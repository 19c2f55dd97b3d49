"""An endpoint's models, asked for on a thread (GET {base}/models) so the picker never waits on
the network; the answer comes back as a queued signal."""

from __future__ import annotations

import threading
from dataclasses import dataclass

from PySide6.QtCore import QObject, Signal

from engine.events import BadRequest
from engine.remote import RemoteError, RemoteModel, list_models


@dataclass(frozen=True)
class Listing:
    base_url: str
    models: tuple[RemoteModel, ...] = ()
    error: str = ""  # one sentence (and its hint) when the endpoint could not be listed


class EndpointListing(QObject):
    sig_listed = Signal(object)
    """A Listing: the models of one endpoint, or why there are none."""

    def fetch(self, base_url: str, api_key: str | None) -> None:
        threading.Thread(target=self._fetch, args=(base_url, api_key), daemon=True,
                         name="hearth-endpoint-models").start()

    def _fetch(self, base_url: str, api_key: str | None) -> None:
        try:
            listing = Listing(base_url, tuple(list_models(base_url, api_key)))
        except RemoteError as e:
            listing = Listing(base_url, error=f"{e.error} {e.hint}".strip())
        except BadRequest as e:
            listing = Listing(base_url, error=str(e))
        try:
            self.sig_listed.emit(listing)
        except RuntimeError:  # the picker closed meanwhile
            pass
