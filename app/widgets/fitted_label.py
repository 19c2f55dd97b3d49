"""A one-line label made of parts ("model · bf16 · KV bf16 · 4,096 tokens · CPU") that, when
narrow, leaves out whole parts from the end and says so with "…", never cutting a word; the
whole line is in its tooltip, above the details."""

from __future__ import annotations

from PySide6.QtWidgets import QLabel, QSizePolicy

SEPARATOR = " · "
MORE = " …"


class FittedLabel(QLabel):
    def __init__(self, text: str = "", parent=None) -> None:
        super().__init__(parent)
        self.setSizePolicy(QSizePolicy.Policy.Ignored, QSizePolicy.Policy.Preferred)
        self.parts: list[str] = []
        self.details = ""
        self.set_parts([text] if text else [])

    @property
    def full_text(self) -> str:
        return SEPARATOR.join(self.parts)

    def set_parts(self, parts: list[str], details: str = "") -> None:
        self.parts = [p for p in parts if p]
        self.details = details
        tip = "\n".join(t for t in (self.full_text, details) if t)
        self.setToolTip(tip)
        if self.parts:  # the first part always shows whole: the label is never narrower
            self.setMinimumWidth(self.fontMetrics().horizontalAdvance(self.parts[0] + MORE))
        self._fit()

    def resizeEvent(self, event) -> None:  # noqa: N802 (Qt override)
        super().resizeEvent(event)
        self._fit()

    def _fit(self) -> None:
        metrics, width = self.fontMetrics(), self.contentsRect().width()
        for n in range(len(self.parts), 0, -1):
            text = SEPARATOR.join(self.parts[:n]) + ("" if n == len(self.parts) else MORE)
            if n == 1 or metrics.horizontalAdvance(text) <= width:
                self.setText(text)
                return
        self.setText("")
