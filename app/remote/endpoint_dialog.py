"""Add an OpenAI-compatible endpoint: its base URL and an optional API key (typed masked). The
URL is checked here; the key goes to the keyring through EndpointBook, never to the settings."""

from __future__ import annotations

from PySide6.QtWidgets import (
    QDialog,
    QDialogButtonBox,
    QFormLayout,
    QLabel,
    QLineEdit,
    QVBoxLayout,
)

from engine.events import BadRequest
from engine.remote import check_api_key, parse_base_url


class EndpointDialog(QDialog):
    def __init__(self, parent=None) -> None:
        super().__init__(parent)
        self.setWindowTitle("Add endpoint")
        self.url_edit = QLineEdit()
        self.url_edit.setPlaceholderText("http://gpu-box:8000/v1")
        self.key_edit = QLineEdit()
        self.key_edit.setEchoMode(QLineEdit.EchoMode.Password)  # shown masked, never echoed
        self.key_edit.setPlaceholderText("optional")
        self.error_label = QLabel()
        self.error_label.setObjectName("errorLabel")
        self.error_label.setWordWrap(True)
        self.error_label.setVisible(False)
        note = QLabel("Any OpenAI-compatible server: vLLM, SGLang, Ollama, llama.cpp, another "
                      "Hearth. The key is kept in the system keyring.")
        note.setWordWrap(True)
        self.buttons = QDialogButtonBox(
            QDialogButtonBox.StandardButton.Ok | QDialogButtonBox.StandardButton.Cancel)
        form = QFormLayout()
        form.addRow("Base URL", self.url_edit)
        form.addRow("API key", self.key_edit)
        layout = QVBoxLayout(self)
        layout.addWidget(note)
        layout.addLayout(form)
        layout.addWidget(self.error_label)
        layout.addWidget(self.buttons)
        self.buttons.accepted.connect(self._on_buttons_accepted)
        self.buttons.rejected.connect(self.reject)

    def base_url(self) -> str:
        return parse_base_url(self.url_edit.text()).text

    def api_key(self) -> str | None:
        return self.key_edit.text().strip() or None

    def _on_buttons_accepted(self) -> None:
        try:
            self.base_url()
            check_api_key(self.api_key())
        except BadRequest as e:
            text = str(e)
            self.error_label.setText(text[:1].upper() + text[1:] + ".")
            self.error_label.setVisible(True)
            return
        self.accept()
