"""The endpoints the user added (their base URLs, in the settings) and the remote model chosen
from one. Keys are endpoint_keys.py's business: nothing here writes one anywhere."""

from __future__ import annotations

from dataclasses import dataclass

from app.app_settings import AppSettings
from app.remote.endpoint_keys import EndpointKeys
from engine.remote import parse_base_url


@dataclass(frozen=True)
class EndpointModel:
    """A model served by an OpenAI-compatible endpoint: the picker's remote choice."""

    base_url: str
    model: str
    context: int = 0  # tokens, where the endpoint says; 0: not said

    @property
    def where(self) -> str:
        return parse_base_url(self.base_url).where


class EndpointBook:
    """The added endpoints: URLs through AppSettings, keys through EndpointKeys."""

    def __init__(self, settings: AppSettings, keys: EndpointKeys) -> None:
        self.settings, self.keys = settings, keys

    def urls(self) -> list[str]:
        return self.settings.endpoints()

    def add(self, url: str, api_key: str | None) -> str:
        """The normalized URL (BadRequest for one that is not an http(s) base URL)."""
        base = parse_base_url(url).text
        if base not in self.urls():
            self.settings.set_endpoints([*self.urls(), base])
        self.keys.set(base, api_key or None)
        return base

    def remove(self, url: str) -> None:
        self.settings.set_endpoints([u for u in self.urls() if u != url])
        self.keys.delete(url)

    def key(self, url: str) -> str | None:
        return self.keys.get(url)
