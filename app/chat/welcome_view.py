"""What an empty conversation shows: the model loaded and what it can do on this machine (GPU or
CPU, format, context), four prompts to start from, and, on the bundled demo model, the way to a
real one (Get a model)."""

from __future__ import annotations

from pathlib import Path

from PySide6.QtCore import Qt, Signal
from PySide6.QtWidgets import QGridLayout, QLabel, QPushButton, QVBoxLayout, QWidget

from app.paths import DEMO_MODEL_DIR
from engine.events import Loaded

SUGGESTED_PROMPTS = (  # short: two to a row, in a narrow window too
    "Explain a KV cache in three sentences.",
    "Write a Python palindrome check.",
    "Pros and cons of a local LLM?",
    "Five names for a cosy café.",
)


def is_demo_model(loaded: Loaded | None) -> bool:
    if loaded is None:
        return False
    try:
        return Path(loaded.model).resolve() == DEMO_MODEL_DIR.resolve()
    except (OSError, RuntimeError):
        return False


class WelcomeView(QWidget):
    sig_prompt_chosen = Signal(str)
    """The user picked a suggested prompt (its text)."""
    sig_get_model_requested = Signal()
    """The user wants a real model (the picker's Get a model)."""

    def __init__(self, parent=None) -> None:
        super().__init__(parent)
        self.setObjectName("welcomeView")
        self.heading = QLabel("Start a conversation")
        self.heading.setObjectName("welcomeHeading")
        self.model_label = QLabel()
        self.model_label.setObjectName("welcomeModel")
        self.model_label.setWordWrap(True)
        self.device_label = QLabel()
        self.device_label.setWordWrap(True)
        self.prompt_buttons = []
        grid = QGridLayout()
        for i, prompt in enumerate(SUGGESTED_PROMPTS):
            button = QPushButton(prompt)
            button.setObjectName("suggestedPrompt")
            button.setToolTip("Send this prompt")
            button.clicked.connect(lambda _=False, p=prompt: self.sig_prompt_chosen.emit(p))
            self.prompt_buttons.append(button)
            grid.addWidget(button, i // 2, i % 2)
        self.demo_label = QLabel(
            "This is Hearth's bundled 5M-parameter demo model: it shows how Hearth works but "
            "gives no real answers. Get a model brings a real one from Hugging Face.")
        self.demo_label.setObjectName("welcomeDemo")
        self.demo_label.setWordWrap(True)
        self.get_model_button = QPushButton("Get a model…")
        self.get_model_button.setObjectName("getModelButton")
        layout = QVBoxLayout(self)
        layout.setContentsMargins(32, 24, 32, 24)
        layout.addStretch(1)
        layout.addWidget(self.heading, 0, Qt.AlignmentFlag.AlignHCenter)
        layout.addWidget(self.model_label)
        layout.addWidget(self.device_label)
        layout.addSpacing(12)
        layout.addLayout(grid)
        layout.addSpacing(12)
        layout.addWidget(self.demo_label)
        layout.addWidget(self.get_model_button, 0, Qt.AlignmentFlag.AlignLeft)
        layout.addStretch(2)
        self.get_model_button.clicked.connect(self.sig_get_model_requested)
        self.show_model(None)

    def show_model(self, loaded: Loaded | None, is_loading: bool = False) -> None:
        """What is loaded (None: nothing yet) and what that means on this machine."""
        is_demo = is_demo_model(loaded)
        self.demo_label.setVisible(is_demo)
        self.get_model_button.setVisible(is_demo)
        for button in self.prompt_buttons:
            button.setEnabled(loaded is not None)
        if loaded is None:
            self.model_label.setText("Loading a model…" if is_loading else
                                     "No model is loaded: choose one with Model… (Ctrl+L).")
            self.device_label.setText("")
            return
        name = "the demo model" if is_demo else (Path(loaded.model).name or loaded.model)
        self.model_label.setText(f"<b>{_escape(name)}</b> · {loaded.quant} · "
                                 f"{loaded.context:,} tokens of context")
        if loaded.device == "cpu":
            self.device_label.setText(
                "It runs on the CPU: small models answer at a readable pace; an NVIDIA GPU "
                "runs larger ones many times faster.")
        elif loaded.device.startswith("cuda"):
            self.device_label.setText(
                f"It runs on the GPU ({loaded.device}) with a {loaded.kv_dtype} KV cache.")
        else:  # an endpoint: the device is where it runs
            self.device_label.setText(f"It runs on the endpoint at {_escape(loaded.device)}.")


def _escape(text: str) -> str:
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
