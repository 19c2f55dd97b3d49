"""A conversation's own settings: title, system prompt, sampling, and the answer length.
Each sampling value can be left to the model's default (unticked): the greyed value shown is
that default, as the engine resolves it for the loaded model (the Loaded event's `sampling`)."""

from __future__ import annotations

import dataclasses

from PySide6.QtWidgets import (
    QCheckBox,
    QDialog,
    QDialogButtonBox,
    QDoubleSpinBox,
    QFormLayout,
    QHBoxLayout,
    QLabel,
    QLineEdit,
    QPlainTextEdit,
    QSpinBox,
    QWidget,
)

from app.history.conversation import ChatSettings, Conversation
from engine.formats.sampling_defaults import ENGINE_DEFAULTS

# field, label, spin box kind, minimum, maximum, step
SAMPLING_FIELDS = (
    ("temperature", "Temperature (0: greedy)", float, 0.0, 5.0, 0.05),
    ("top_p", "Top-p", float, 0.01, 1.0, 0.01),
    ("top_k", "Top-k (0: off)", int, 0, 1000, 1),
    ("repetition_penalty", "Repetition penalty", float, 0.5, 3.0, 0.01),
    ("seed", "Seed", int, 0, 2**31 - 1, 1),
)
UNKNOWN_DEFAULT = "model's default"  # shown unticked where no model says (none, an endpoint)
RANDOM_SEED = "random"  # an unticked seed: a new one each answer


class ConversationSettingsDialog(QDialog):
    """`defaults`: the loaded model's sampling defaults (Loaded.sampling; {} where unknown)."""

    def __init__(self, conversation: Conversation, parent=None,
                 defaults: dict | None = None) -> None:
        super().__init__(parent)
        self.setWindowTitle("Conversation settings")
        self.conversation = conversation
        self.defaults = dict(defaults or {})
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
        source = self.defaults.get("source")
        self.defaults_label = QLabel(
            f"Unticked: the model's default, from {source}." if source else
            "Unticked: the model's default.")
        self.defaults_label.setWordWrap(True)
        form.addRow(self.defaults_label)
        self.overrides: dict[str, tuple[QCheckBox, QSpinBox | QDoubleSpinBox]] = {}
        for name, label, kind, lo, hi, step in SAMPLING_FIELDS:
            box = QCheckBox()
            spin = QDoubleSpinBox() if kind is float else QSpinBox()
            if kind is float:
                spin.setDecimals(2)
            default = self.defaults.get(name)
            # a model's default outside the usual range is still shown as it is
            spin.setRange(lo if default is None else min(lo, default),
                          hi if default is None else max(hi, default))
            spin.setSingleStep(step)
            value = getattr(settings, name)
            box.setChecked(value is not None)
            if value is not None:
                spin.setValue(value)
            else:
                self._show_default(name, spin)
            spin.setEnabled(value is not None)
            box.toggled.connect(lambda on, n=name, s=spin: self._on_box_toggled(n, s, on))
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

    def _show_default(self, name: str, spin: QSpinBox | QDoubleSpinBox) -> None:
        """An unticked field shows what the engine will use: the model's default, or words where
        that is no number (a random seed) or unknown (no model, an endpoint's model)."""
        default = self.defaults.get(name)
        if default is None:  # the special text shows while the value is the minimum
            spin.setSpecialValueText(RANDOM_SEED if name == "seed" else UNKNOWN_DEFAULT)
            spin.setValue(spin.minimum())
        else:
            spin.setSpecialValueText("")
            spin.setValue(default)

    def _on_box_toggled(self, name: str, spin: QSpinBox | QDoubleSpinBox, on: bool) -> None:
        spin.setEnabled(on)
        if not on:
            return self._show_default(name, spin)
        if spin.specialValueText():  # a value of the user's own from here: start from a number
            spin.setSpecialValueText("")
            spin.setValue(ENGINE_DEFAULTS.get(name, spin.minimum()))

    def title(self) -> str:
        return self.title_edit.text()

    def settings(self) -> ChatSettings:
        values = {name: (spin.value() if box.isChecked() else None)
                  for name, (box, spin) in self.overrides.items()}
        return dataclasses.replace(
            self.conversation.settings, system_prompt=self.system_edit.toPlainText(),
            max_new_tokens=self.max_new_tokens.value(), **values)
