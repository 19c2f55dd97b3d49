"""The status-bar strip about the model: loading progress (with cancel), or what is loaded and
how (format, KV dtype, context, device), and the button that opens the model picker."""

from __future__ import annotations

from pathlib import Path

from PySide6.QtCore import Signal
from PySide6.QtWidgets import QHBoxLayout, QLabel, QProgressBar, QPushButton, QWidget

from engine.events import Loaded, LoadProgress

GiB = 1 << 30


class ModelStatusPanel(QWidget):
    sig_choose_requested = Signal()
    """The user wants to choose another model."""
    sig_cancel_requested = Signal()
    """The user wants the running load stopped."""

    def __init__(self, parent=None) -> None:
        super().__init__(parent)
        self.label = QLabel("No model loaded")
        self.progress = QProgressBar()
        self.progress.setMaximumWidth(180)
        self.progress.setVisible(False)
        self.cancel_button = QPushButton("Cancel load")
        self.cancel_button.setVisible(False)
        self.choose_button = QPushButton("Model…")
        layout = QHBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.addWidget(self.label, 1)
        layout.addWidget(self.progress)
        layout.addWidget(self.cancel_button)
        layout.addWidget(self.choose_button)
        self.cancel_button.clicked.connect(self.sig_cancel_requested)
        self.choose_button.clicked.connect(self.sig_choose_requested)

    def show_loading(self, name: str) -> None:
        self.label.setText(f"Loading {name}…")
        self.progress.setRange(0, 0)  # busy until the first LoadProgress
        self.progress.setVisible(True)
        self.cancel_button.setVisible(True)

    def show_progress(self, event: LoadProgress) -> None:
        self.progress.setRange(0, max(event.total, 1))
        self.progress.setValue(event.done)
        self.progress.setFormat(f"{event.stage} %v/%m")
        if event.message:
            self.label.setText(f"Loading: {event.message}")

    def show_loaded(self, event: Loaded) -> None:
        self._end_loading()
        notes = f" · {'; '.join(event.notes)}" if event.notes else ""
        name = Path(event.model).name or event.model  # the worker names the folder it loaded
        self.label.setText(
            f"{name} · {event.quant} · KV {event.kv_dtype} {event.kv_cache_bytes / GiB:.2f} GiB · "
            f"{event.context:,} tokens · "
            f"{event.device} · weights {event.weights_bytes / GiB:.2f} GiB{notes}")
        self.label.setToolTip(f"{event.model}\n{event.architecture}{notes}")

    def show_unloaded(self, text: str = "No model loaded") -> None:
        self._end_loading()
        self.label.setText(text)

    def _end_loading(self) -> None:
        self.progress.setVisible(False)
        self.cancel_button.setVisible(False)
