"""Pick a model, its weight format, KV dtype and context, and see before loading whether it
fits this card: weights, KV cache and total in GiB per format, from the planner."""

from __future__ import annotations

from pathlib import Path

from PySide6.QtCore import Qt
from PySide6.QtGui import QColor
from PySide6.QtWidgets import (
    QAbstractItemView,
    QComboBox,
    QDialog,
    QDialogButtonBox,
    QFileDialog,
    QFormLayout,
    QHBoxLayout,
    QLabel,
    QListWidget,
    QListWidgetItem,
    QPushButton,
    QSpinBox,
    QTableWidget,
    QTableWidgetItem,
    QVBoxLayout,
)

from app import fit_check
from app.app_settings import AppSettings
from app.model_catalog import ModelEntry, all_entries
from engine.events import LoadRequest
from engine.gpu import GpuReport
from engine.plan import PlanError

GiB = fit_check.GiB
ENTRY_ROLE = Qt.ItemDataRole.UserRole
COLUMNS = ("Format", "Weights GiB", "KV cache GiB", "Total GiB", "Fits")
FIT_WORDS = {True: "yes", False: "no", None: "unknown"}
FIT_COLORS = {True: QColor("#2e7d32"), False: QColor("#c62828"), None: QColor("#757575")}


class ModelPickerDialog(QDialog):
    def __init__(self, settings: AppSettings, gpu_report: GpuReport | None = None,
                 hub: Path | None = None, parent=None) -> None:
        super().__init__(parent)
        self.setWindowTitle("Choose a model")
        self.resize(860, 520)
        self.settings = settings
        self.gpu_report = gpu_report
        self.hub = hub
        self.shape = None
        self.table_data: fit_check.FitTable | None = None

        self.model_list = QListWidget()
        self.add_button = QPushButton("Add folder…")
        self.remove_button = QPushButton("Remove")
        self.summary_label = QLabel()
        self.summary_label.setWordWrap(True)
        self.gpu_label = QLabel()
        self.gpu_label.setWordWrap(True)
        self.quant_combo = QComboBox()
        self.quant_combo.addItems(fit_check.QUANT_CHOICES)
        self.kv_combo = QComboBox()
        self.kv_combo.addItems(fit_check.KV_CHOICES)
        self.context_spin = QSpinBox()
        self.context_spin.setRange(16, 16)
        self.context_spin.setSingleStep(1024)
        self.context_spin.setKeyboardTracking(False)  # re-plan when typing ends, not per digit
        self.fit_table = QTableWidget(0, len(COLUMNS))
        self.fit_table.setHorizontalHeaderLabels(COLUMNS)
        self.fit_table.setEditTriggers(QAbstractItemView.EditTrigger.NoEditTriggers)
        self.fit_table.setSelectionBehavior(QAbstractItemView.SelectionBehavior.SelectRows)
        self.fit_table.verticalHeader().setVisible(False)
        self.recommendation_label = QLabel()
        self.recommendation_label.setWordWrap(True)
        self.verdict_label = QLabel()
        self.verdict_label.setObjectName("verdictLabel")
        self.verdict_label.setWordWrap(True)
        self.buttons = QDialogButtonBox(
            QDialogButtonBox.StandardButton.Ok | QDialogButtonBox.StandardButton.Cancel)
        self.load_button = self.buttons.button(QDialogButtonBox.StandardButton.Ok)
        self.load_button.setText("Load")

        left = QVBoxLayout()
        left.addWidget(self.model_list, 1)
        row = QHBoxLayout()
        row.addWidget(self.add_button)
        row.addWidget(self.remove_button)
        left.addLayout(row)
        form = QFormLayout()
        form.addRow("Quantization", self.quant_combo)
        form.addRow("KV cache", self.kv_combo)
        form.addRow("Context (tokens)", self.context_spin)
        right = QVBoxLayout()
        right.addWidget(self.summary_label)
        right.addWidget(self.gpu_label)
        right.addLayout(form)
        right.addWidget(self.fit_table, 1)
        right.addWidget(self.recommendation_label)
        right.addWidget(self.verdict_label)
        body = QHBoxLayout()
        body.addLayout(left, 1)
        body.addLayout(right, 2)
        layout = QVBoxLayout(self)
        layout.addLayout(body, 1)
        layout.addWidget(self.buttons)

        self.model_list.currentItemChanged.connect(self._on_model_list_current_item_changed)
        self.add_button.clicked.connect(self._on_add_button_clicked)
        self.remove_button.clicked.connect(self._on_remove_button_clicked)
        self.quant_combo.currentTextChanged.connect(self._on_choice_changed)
        self.kv_combo.currentTextChanged.connect(self._on_choice_changed)
        self.context_spin.valueChanged.connect(self._on_choice_changed)
        self.fit_table.cellClicked.connect(self._on_fit_table_cell_clicked)
        self.buttons.accepted.connect(self.accept)
        self.buttons.rejected.connect(self.reject)
        self._show_gpu()
        self._fill_models()

    # ------------------------------------------------------------------ public

    def set_gpu_report(self, report: GpuReport) -> None:
        self.gpu_report = report
        self._show_gpu()
        self._replan(preselect=True)  # the recommendation for the card, now that it is known

    def add_folder(self, folder: Path) -> None:
        folders = self.settings.model_folders()
        if folder not in folders:
            self.settings.set_model_folders([*folders, folder])
        self._fill_models(select=folder)

    def selected_entry(self) -> ModelEntry | None:
        item = self.model_list.currentItem()
        return item.data(ENTRY_ROLE) if item is not None else None

    def load_request(self) -> LoadRequest | None:
        entry = self.selected_entry()
        if entry is None:
            return None
        context = self.context_spin.value() if self.shape is not None else None
        return LoadRequest(model=entry.load_name, quant=self.quant_combo.currentText(),
                           kv_dtype=self.kv_combo.currentText(), context=context)

    # ------------------------------------------------------------------ slots

    def _on_model_list_current_item_changed(self, item, _previous) -> None:
        self.shape = None
        self.remove_button.setEnabled(item is not None and item.data(ENTRY_ROLE).source == "folder")
        if item is None:
            self.summary_label.setText("No model chosen.")
            self._replan()
            return
        entry: ModelEntry = item.data(ENTRY_ROLE)
        try:
            self.shape = fit_check.model_shape(entry.folder)
        except PlanError as e:
            self.summary_label.setText(f"{entry.label}: {e}")
            self._replan()
            return
        s = fit_check.summarize(self.shape)
        stored = f"{s.checkpoint_format} checkpoint" if s.checkpoint_format else s.native_dtype
        self.summary_label.setText(
            f"<b>{entry.label}</b><br>{s.architecture} · {s.num_params / 1e9:.2f} B parameters · "
            f"{s.native_context:,}-token native context · stored as {stored}")
        self.context_spin.blockSignals(True)
        self.context_spin.setRange(16, s.native_context)
        self.context_spin.setValue(s.native_context)
        self.context_spin.blockSignals(False)
        self._replan(preselect=True)

    def _on_add_button_clicked(self) -> None:
        folder = QFileDialog.getExistingDirectory(self, "Model folder (with config.json)")
        if folder:
            self.add_folder(Path(folder))

    def _on_remove_button_clicked(self) -> None:
        entry = self.selected_entry()
        if entry is not None and entry.source == "folder":
            self.settings.set_model_folders(
                [f for f in self.settings.model_folders() if f != entry.folder])
            self._fill_models()

    def _on_choice_changed(self, _value) -> None:
        self._replan()

    def _on_fit_table_cell_clicked(self, row: int, _column: int) -> None:
        self.quant_combo.setCurrentText(self.fit_table.item(row, 0).text())

    # ------------------------------------------------------------------ helpers

    def _fill_models(self, select: Path | None = None) -> None:
        last = self.settings.last_load()
        self.model_list.clear()
        for entry in all_entries(self.settings.model_folders(), self.hub):
            item = QListWidgetItem(f"{entry.label}  ({entry.source})")
            item.setToolTip(str(entry.folder))
            item.setData(ENTRY_ROLE, entry)
            self.model_list.addItem(item)
            is_last = select is None and last is not None and last.model == entry.load_name
            if entry.folder == select or is_last:
                self.model_list.setCurrentItem(item)
        if self.model_list.currentItem() is None and self.model_list.count():
            self.model_list.setCurrentRow(0)
        if not self.model_list.count():
            self.summary_label.setText("No models found: add a model folder (with config.json).")
            self._replan()

    def _show_gpu(self) -> None:
        gpu = fit_check.first_gpu(self.gpu_report)
        if self.gpu_report is None:
            self.gpu_label.setText("Looking for a GPU…")
        elif gpu is None:
            self.gpu_label.setText(f"No GPU: {self.gpu_report.reason}")
        else:
            self.gpu_label.setText(
                f"{gpu.name}: {gpu.free_bytes / GiB:.1f} GiB free of {gpu.total_bytes / GiB:.1f} "
                f"GiB (driver {gpu.driver_version or 'unknown'})")

    def _replan(self, preselect: bool = False) -> None:
        self.fit_table.setRowCount(0)
        self.table_data = None
        if self.shape is None:
            self.recommendation_label.setText("")
            self.verdict_label.setText("")
            self.load_button.setEnabled(False)  # a folder the planner cannot read won't load
            return
        gpu = fit_check.first_gpu(self.gpu_report)
        try:
            table = fit_check.fit_table(self.shape, gpu, self.kv_combo.currentText(),
                                        self.context_spin.value())
            if preselect and self.quant_combo.findText(table.recommended_quant) >= 0:
                self.quant_combo.blockSignals(True)
                self.quant_combo.setCurrentText(table.recommended_quant)
                self.quant_combo.blockSignals(False)
            self._show_verdict(table)
        except PlanError as e:
            self.verdict_label.setText(str(e))
            self.load_button.setEnabled(False)
            return
        self.table_data = table
        for row in table.rows:
            self._add_fit_row(row)
        note = f" {table.note}" if table.note else ""
        self.recommendation_label.setText(
            f"Recommended: {table.recommended_quant} weights, {table.recommended_kv_dtype} KV "
            f"cache, {table.recommended_context:,} tokens.{note}")
        self.load_button.setEnabled(True)

    def _add_fit_row(self, row: fit_check.FitRow) -> None:
        r = self.fit_table.rowCount()
        self.fit_table.insertRow(r)
        fits = "no GPU" if row.fits is None else FIT_WORDS[row.fits]
        cells = (row.quant, f"{row.weights_bytes / GiB:.2f}", f"{row.kv_bytes / GiB:.2f}",
                 f"{row.total_bytes / GiB:.2f}", fits)
        for c, text in enumerate(cells):
            item = QTableWidgetItem(text)
            item.setToolTip(row.reason)
            if c == 4:
                item.setForeground(FIT_COLORS[row.fits])
            self.fit_table.setItem(r, c, item)

    def _show_verdict(self, table: fit_check.FitTable) -> None:
        quant = self.quant_combo.currentText()
        quant = table.recommended_quant if quant == "auto" else quant
        row = next((r for r in table.rows if r.quant == quant), None)
        if row is None:  # fp16 is not a table row
            row = fit_check.fit_row(self.shape, fit_check.first_gpu(self.gpu_report), quant,
                                    self.kv_combo.currentText(), self.context_spin.value())
        verdict = {True: "fits", False: "does not fit", None: "runs on the CPU"}[row.fits]
        self.verdict_label.setText(f"{row.reason}: {verdict}.")
        self.verdict_label.setProperty("fits", FIT_WORDS[row.fits])
        self.verdict_label.style().unpolish(self.verdict_label)
        self.verdict_label.style().polish(self.verdict_label)
