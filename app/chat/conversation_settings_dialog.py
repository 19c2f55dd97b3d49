"""A conversation's own settings: title, system prompt, sampling, and the answer length.
Each sampling value can be left to the model's default (unticked)."""

from __future__ import annotations

import dataclasses

from PySide6.QtWidgets import (
    QCheckBox,
    QDialog,
    QDialogButtonBox,
    QDoubleSpinBox,
    QFormLayout,
    QHBoxLayout,
    QLineEdit,
    QPlainTextEdit,
    QSpinBox,
    QWidget,
)

from app.history.conversation import ChatSettings, Conversation

# field, label, spin box kind, minimum, maximum, step, value shown when first ticked
SAMPLING_FIELDS = (
    ("temperature", "Temperature (0: greedy)", float, 0.0, 5.0, 0.05, 0.7),
    ("top_p", "Top-p", float, 0.01, 1.0, 0.01, 0.9),
    ("top_k", "Top-k (0: off)", int, 0, 1000, 1, 40),
    ("repetition_penalty", "Repetition penalty", float, 0.5, 3.0, 0.01, 1.1),
    ("seed", "Seed", int, 0, 2**31 - 1, 1, 0),
)


class ConversationSettingsDialog(QDialog):
    def __init__(self, conversation: Conversation, parent=None) -> None:
        super().__init__(parent)
        self.setWindowTitle("Conversation settings")
        self.conversation = conversation
        settings = conversation.settings
        self.title_edit = QLineEdit(conversation.title)
        self.system_edit = QPlainTextEdit(settings.system_prompt)
        self.system_edit.setPlaceholderText("The model's default system prompt")
        self.max_new_tokens = QSpinBox()
        self.max_new_tokens.setRange(1, 131072)
        self.max_new_tokens.setValue(settings.max_new_tokens)
        form = QFormLayout(self)
        form.addRow("Title", self.title_edit)
        form.addRow("System prompt", self.system_edit)
        form.addRow("Max new tokens", self.max_new_tokens)
        self.overrides: dict[str, tuple[QCheckBox, QSpinBox | QDoubleSpinBox]] = {}
        for name, label, kind, lo, hi, step, initial in SAMPLING_FIELDS:
            box = QCheckBox()
            spin = QDoubleSpinBox() if kind is float else QSpinBox()
            if kind is float:
                spin.setDecimals(2)
            spin.setRange(lo, hi)
            spin.setSingleStep(step)
            value = getattr(settings, name)
            box.setChecked(value is not None)
            spin.setValue(value if value is not None else initial)
            spin.setEnabled(value is not None)
            box.toggled.connect(spin.setEnabled)
            row = QWidget()
            row_layout = QHBoxLayout(row)
            row_layout.setContentsMargins(0, 0, 0, 0)
            row_layout.addWidget(box)
            row_layout.addWidget(spin, 1)
            form.addRow(label, row)
            self.overrides[name] = (box, spin)
        buttons = QDialogButtonBox(
            QDialogButtonBox.StandardButton.Ok | QDialogButtonBox.StandardButton.Cancel)
        buttons.accepted.connect(self.accept)
        buttons.rejected.connect(self.reject)
        form.addRow(buttons)

    def title(self) -> str:
        return self.title_edit.text()

    def settings(self) -> ChatSettings:
        values = {name: (spin.value() if box.isChecked() else None)
                  for name, (box, spin) in self.overrides.items()}
        return dataclasses.replace(
            self.conversation.settings, system_prompt=self.system_edit.toPlainText(),
            max_new_tokens=self.max_new_tokens.value(), **values)
