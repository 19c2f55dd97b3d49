"""What Hearth remembers between runs (QSettings): the model folders the user added, the last
model choice, the endpoints added (URLs only: keys live in the keyring), the window's geometry,
its theme, which key sends, and the Server panel's address and keep-serving choice (its key is in
the keyring)."""

from __future__ import annotations

import json
from pathlib import Path

from PySide6.QtCore import QByteArray, QSettings

from engine.events import LoadRequest


class AppSettings:
    def __init__(self, qsettings: QSettings | None = None) -> None:
        self.q = qsettings if qsettings is not None else QSettings()

    def model_folders(self) -> list[Path]:
        value = self.q.value("models/folders", "[]")
        return [Path(p) for p in json.loads(value or "[]")]

    def set_model_folders(self, folders: list[Path]) -> None:
        self.q.setValue("models/folders", json.dumps([str(p) for p in folders]))

    def last_load(self) -> LoadRequest | None:
        value = self.q.value("models/last_load", "")
        if not value:
            return None
        obj = json.loads(value)
        return LoadRequest(model=obj.get("model"), quant=obj.get("quant", "auto"),
                           kv_dtype=obj.get("kv_dtype", "auto"), context=obj.get("context"),
                           draft=obj.get("draft"),
                           num_speculative_tokens=obj.get("num_speculative_tokens"),
                           tensor_parallel=obj.get("tensor_parallel", 1),
                           reproducible=obj.get("reproducible"))

    def set_last_load(self, request: LoadRequest) -> None:
        self.q.setValue("models/last_load", json.dumps({
            "model": request.model, "quant": request.quant, "kv_dtype": request.kv_dtype,
            "context": request.context, "draft": request.draft,
            "num_speculative_tokens": request.num_speculative_tokens,
            "tensor_parallel": request.tensor_parallel, "reproducible": request.reproducible}))

    def endpoints(self) -> list[str]:
        """Base URLs of the OpenAI-compatible endpoints added; their keys are in the keyring."""
        value = self.q.value("endpoints/urls", "[]")
        return [u for u in json.loads(value or "[]") if isinstance(u, str)]

    def set_endpoints(self, urls: list[str]) -> None:
        self.q.setValue("endpoints/urls", json.dumps(list(urls)))

    def theme(self) -> str:
        """"system" (the desktop's colour scheme), "light" or "dark"."""
        return str(self.q.value("window/theme", "system"))

    def set_theme(self, mode: str) -> None:
        self.q.setValue("window/theme", mode)

    def sends_on_ctrl_enter(self) -> bool:
        """Ctrl+Enter sends (Enter starts a new line); by default Enter sends."""
        return str(self.q.value("chat/send_on_ctrl_enter", "false")).lower() == "true"

    def set_sends_on_ctrl_enter(self, on: bool) -> None:
        self.q.setValue("chat/send_on_ctrl_enter", "true" if on else "false")

    def geometry(self) -> QByteArray | None:
        value = self.q.value("window/geometry")
        return value if isinstance(value, QByteArray) else None

    def set_geometry(self, geometry: QByteArray) -> None:
        self.q.setValue("window/geometry", geometry)

    def server(self) -> dict:
        """The Server panel's last host, port and keep-serving choice (its API key is in the
        keyring, as the endpoints' keys are: app/server/server_panel.py)."""
        value = json.loads(self.q.value("server/settings", "{}") or "{}")
        return {"host": str(value.get("host", "127.0.0.1")), "port": int(value.get("port", 8000)),
                "keep": bool(value.get("keep", False))}

    def set_server(self, values: dict) -> None:
        self.q.setValue("server/settings", json.dumps(values))
