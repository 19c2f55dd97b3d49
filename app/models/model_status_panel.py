"""The status-bar strip about the model: loading progress (with cancel), or what is loaded and
how (format, KV dtype, context, device, or the endpoint it runs on), and the button that opens
the model picker. One short line (model, format, KV, context, device), the details in its
tooltip."""

from __future__ import annotations

from pathlib import Path

from PySide6.QtCore import Signal
from PySide6.QtWidgets import QHBoxLayout, QProgressBar, QPushButton, QWidget

from app.widgets.fitted_label import FittedLabel
from engine.events import Loaded, LoadProgress

GiB = 1 << 30


class ModelStatusPanel(QWidget):
    sig_choose_requested = Signal()
    """The user wants to choose another model."""
    sig_cancel_requested = Signal()
    """The user wants the running load stopped."""

    def __init__(self, parent=None) -> None:
        super().__init__(parent)
        self.label = FittedLabel("No model loaded")
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
        self.label.set_parts([f"Loading {name}…"])
        self.progress.setRange(0, 0)  # busy until the first LoadProgress
        self.progress.setVisible(True)
        self.cancel_button.setVisible(True)

    def show_progress(self, event: LoadProgress) -> None:
        self.progress.setRange(0, max(event.total, 1))
        self.progress.setValue(event.done)
        self.progress.setFormat(f"{event.stage} %v/%m")
        if event.message:
            self.label.set_parts([f"Loading: {event.message}"])

    def show_loaded(self, event: Loaded) -> None:
        self._end_loading()
        name = Path(event.model).name or event.model  # the worker names the folder it loaded
        device = _device_name(event.device)
        details = [event.model, event.architecture,
                   f"weights {event.weights_bytes / GiB:.2f} GiB in {event.quant}",
                   f"KV cache {event.kv_cache_bytes / GiB:.2f} GiB in {event.kv_dtype}",
                   *event.notes]
        self.label.set_parts([name, event.quant, f"KV {event.kv_dtype}",
                              f"{event.context:,} tokens", device], "\n".join(details))

    def show_remote(self, model: str, where: str, context: int) -> None:
        """A model of an OpenAI-compatible endpoint is in use."""
        self._end_loading()
        tokens = f"{context:,} tokens" if context else ""
        self.label.set_parts([model, f"on the endpoint at {where}", tokens],
                             f"served by {where} (OpenAI-compatible)")

    def show_unloaded(self, text: str = "No model loaded") -> None:
        self._end_loading()
        self.label.set_parts([text])

    def _end_loading(self) -> None:
        self.progress.setVisible(False)
        self.cancel_button.setVisible(False)


def _device_name(device: str) -> str:
    """"cpu" -> "CPU", "cuda:1" -> "GPU 1", "cuda" -> "GPU"."""
    if device == "cpu":
        return "CPU"
    if device.startswith("cuda"):
        return f"GPU {device.partition(':')[2]}".strip()
    return device
