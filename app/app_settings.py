"""What Hearth remembers between runs (QSettings): the model folders the user added, the last
model choice, and the window's geometry."""

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
                           tensor_parallel=obj.get("tensor_parallel", 1))

    def set_last_load(self, request: LoadRequest) -> None:
        self.q.setValue("models/last_load", json.dumps({
            "model": request.model, "quant": request.quant, "kv_dtype": request.kv_dtype,
            "context": request.context, "draft": request.draft,
            "num_speculative_tokens": request.num_speculative_tokens,
            "tensor_parallel": request.tensor_parallel}))

    def geometry(self) -> QByteArray | None:
        value = self.q.value("window/geometry")
        return value if isinstance(value, QByteArray) else None

    def set_geometry(self, geometry: QByteArray) -> None:
        self.q.setValue("window/geometry", geometry)
