"""Endpoints' API keys in the system keyring (Secret Service, Keychain, Windows Credential
Locker, through `keyring`): never in the settings, the database or a log. Where no keyring
works, a key is held in memory for this session only, and `notice` says so for the window."""

from __future__ import annotations

import logging

log = logging.getLogger("hearth.keys")

SERVICE = "Hearth endpoints"  # the keyring's service name; the username is the base URL
NO_KEYRING = ("No system keyring is available, so this API key is kept for this session only "
              "(never written to disk): add the endpoint again after a restart.")


class EndpointKeys:
    def __init__(self, service: str = SERVICE) -> None:
        self.service = service  # the keyring's service name
        self._session: dict[str, str] = {}  # base URL -> key, when the keyring failed
        self.has_keyring: bool | None = None  # None until the keyring was first used

    @property
    def notice(self) -> str:
        return NO_KEYRING if self.has_keyring is False else ""

    def get(self, base_url: str) -> str | None:
        if base_url in self._session:
            return self._session[base_url]
        try:
            import keyring

            key = keyring.get_password(self.service, base_url)
        except Exception as e:  # a backend raises its own: D-Bus, a locked store
            self._lost(e)
            return None
        self.has_keyring = True
        return key or None

    def set(self, base_url: str, key: str | None) -> None:
        """Keep `key` for `base_url`; an empty key forgets any kept one."""
        if not key:
            self.delete(base_url)
            return
        try:
            import keyring

            keyring.set_password(self.service, base_url, key)
        except Exception as e:
            self._lost(e)
            self._session[base_url] = key
            return
        self.has_keyring = True
        self._session.pop(base_url, None)

    def delete(self, base_url: str) -> None:
        self._session.pop(base_url, None)
        try:
            import keyring

            keyring.delete_password(self.service, base_url)
        except Exception:  # none kept, or no keyring: nothing to delete
            pass

    def _lost(self, e: Exception) -> None:
        if self.has_keyring is not False:
            # the error's type only: a backend's message could quote what it was given
            log.warning("the system keyring is not usable (%s); API keys are kept for this "
                        "session only", type(e).__name__)
        self.has_keyring = False
