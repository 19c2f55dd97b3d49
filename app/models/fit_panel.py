"""Will this model fit this card, and how should it load: weight format, KV dtype, context and
speculative decoding (a draft model or prompt lookup), and per format the weights, KV cache and
total in GiB, from the planner. Shows one model shape at a time, a local folder's or a Hub
repo's before it is downloaded."""

from __future__ import annotations

from dataclasses import dataclass

from PySide6.QtCore import Signal
from PySide6.QtGui import QColor
from PySide6.QtWidgets import (
    QAbstractItemView,
    QCheckBox,
    QComboBox,
    QFormLayout,
    QHeaderView,
    QLabel,
    QSpinBox,
    QTableWidget,
    QTableWidgetItem,
    QVBoxLayout,
    QWidget,
)

from app.models import fit_check, split_check
from engine.events import MAX_SPECULATIVE_TOKENS
from engine.plan.memory import PlanError
from engine.platform.gpu import GpuReport

GiB = fit_check.GiB
COLUMNS = ("Format", "Weights GiB", "KV cache GiB", "Total GiB", "Fits")
FIT_WORDS = {True: "yes", False: "no", None: "unknown"}
FIT_COLORS = {True: QColor("#2e7d32"), False: QColor("#c62828"), None: QColor("#757575")}
OFF, PROMPT_LOOKUP = "Off", "Prompt lookup (no extra model)"


@dataclass(frozen=True)
class SpeculationChoice:
    """How to speculate: with a draft model (chosen at load) or prompt lookup (per request)."""

    draft: str | None = None  # LoadRequest.draft: a folder or a cached repo id
    prompt_lookup: bool = False  # GenerateRequest.prompt_lookup
    num_speculative_tokens: int | None = None  # K; None: the engine adapts it


class FitPanel(QWidget):
    sig_plan_changed = Signal(bool)
    """The fit was worked out again: True when there is a plan to load with."""

    def __init__(self, gpu_report: GpuReport | None = None, parent=None) -> None:
        super().__init__(parent)
        self.gpu_report = gpu_report
        self.shape = None
        self.table_data: fit_check.FitTable | None = None

        self.summary_label = QLabel("No model chosen.")
        self.summary_label.setWordWrap(True)
        self.gpu_label = QLabel()
        self.gpu_label.setWordWrap(True)
        self.quant_combo = QComboBox()
        self.quant_combo.addItems(fit_check.quant_choices())
        self.kv_combo = QComboBox()
        self.kv_combo.addItems(fit_check.kv_choices())
        self.context_spin = QSpinBox()
        self.context_spin.setRange(16, 16)
        self.context_spin.setSingleStep(1024)
        self.context_spin.setKeyboardTracking(False)  # re-plan when typing ends, not per digit
        self.speculation_combo = QComboBox()
        self.speculation_combo.setToolTip(
            "Speculative decoding: a small draft model (same tokenizer) or n-gram lookup in the "
            "conversation proposes tokens that the model checks several at a time. Greedy "
            "answers match plain decoding token for token with Reproducible greedy on; without "
            "it they can differ where the model's top two choices are close")
        self.reproducible_check = QCheckBox("Same greedy answer however it was computed")
        self.reproducible_check.setToolTip(
            "Reproducible greedy: a greedy answer comes out the same with a warm or cold cache, "
            "on regenerate and with speculation. Decode runs as fast; the prompt takes several "
            "times longer to read (4-9x on a CPU, 17-24x on a GPU in bf16)")
        self.speculative_spin = QSpinBox()
        self.speculative_spin.setRange(0, MAX_SPECULATIVE_TOKENS)
        self.speculative_spin.setSpecialValueText("adaptive")  # 0: the engine picks K as it goes
        self.gpus_spin = QSpinBox()  # shown where the machine has several GPUs
        self.gpus_spin.setRange(1, 1)
        self.gpus_spin.setToolTip(
            "Tensor parallelism: each GPU holds a share of every layer and they decode together; "
            "a model larger than one card fits across several")
        self._drafts: list[tuple[str, str, object]] = []  # (label, load name, ModelShape)
        self.fit_table = QTableWidget(0, len(COLUMNS))
        self.fit_table.setHorizontalHeaderLabels(COLUMNS)
        self.fit_table.setEditTriggers(QAbstractItemView.EditTrigger.NoEditTriggers)
        self.fit_table.setSelectionBehavior(QAbstractItemView.SelectionBehavior.SelectRows)
        self.fit_table.verticalHeader().setVisible(False)
        self.fit_table.horizontalHeader().setSectionResizeMode(QHeaderView.ResizeMode.Stretch)
        self.recommendation_label = QLabel()
        self.recommendation_label.setWordWrap(True)
        self.split_label = QLabel()  # the split the planner suggests, where it beats one card
        self.split_label.setObjectName("splitLabel")
        self.split_label.setWordWrap(True)
        self.verdict_label = QLabel()
        self.verdict_label.setObjectName("verdictLabel")
        self.verdict_label.setWordWrap(True)

        self.form = QFormLayout()
        self.form.addRow("Quantization", self.quant_combo)
        self.form.addRow("KV cache", self.kv_combo)
        self.form.addRow("Context (tokens)", self.context_spin)
        self.form.addRow("Speculative decoding", self.speculation_combo)
        self.form.addRow("Speculative tokens", self.speculative_spin)
        self.form.addRow("GPUs (tensor parallel)", self.gpus_spin)
        self.form.addRow("Reproducible greedy", self.reproducible_check)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.addWidget(self.summary_label)
        layout.addWidget(self.gpu_label)
        layout.addLayout(self.form)
        layout.addWidget(self.fit_table, 1)
        layout.addWidget(self.recommendation_label)
        layout.addWidget(self.split_label)
        layout.addWidget(self.verdict_label)

        self.quant_combo.currentTextChanged.connect(self._on_choice_changed)
        self.kv_combo.currentTextChanged.connect(self._on_choice_changed)
        self.context_spin.valueChanged.connect(self._on_choice_changed)
        self.speculation_combo.currentIndexChanged.connect(self._on_choice_changed)
        self.gpus_spin.valueChanged.connect(self._on_choice_changed)
        self.set_drafts([])
        self.fit_table.cellClicked.connect(self._on_fit_table_cell_clicked)
        self._show_gpu()

    # ------------------------------------------------------------------ public

    def set_gpu_report(self, report: GpuReport) -> None:
        self.gpu_report = report
        self._show_gpu()
        self._replan(preselect=True)  # the recommendation for the card, now that it is known

    def show_shape(self, shape, title: str, detail: str = "") -> None:
        """Plan for `shape` (an engine.plan.memory.ModelShape) at its native context."""
        self.shape = shape
        s = fit_check.summarize(shape)
        stored = f"{s.checkpoint_format} checkpoint" if s.checkpoint_format else s.native_dtype
        extra = f"<br>{detail}" if detail else ""
        self.summary_label.setText(
            f"<b>{title}</b><br>{s.architecture} · {params_text(s.num_params)} parameters · "
            f"{s.native_context:,}-token native context · stored as {stored}{extra}")
        self.context_spin.blockSignals(True)
        self.context_spin.setRange(16, s.native_context)
        self.context_spin.setValue(s.native_context)
        self.context_spin.blockSignals(False)
        self._replan(preselect=True)

    def show_nothing(self, text: str) -> None:
        """No plan: `text` says why (no model chosen, a folder the planner cannot read)."""
        self.shape = None
        self.summary_label.setText(text)
        self._replan()

    def set_drafts(self, drafts: list[tuple[str, str, object]]) -> None:
        """The draft models to offer, as (label, load name, ModelShape); Off and prompt lookup
        are always offered. Keeps the current choice where it is still offered."""
        current = self.speculation_combo.currentText()
        self._drafts = list(drafts)
        self.speculation_combo.blockSignals(True)
        self.speculation_combo.clear()
        self.speculation_combo.addItems([OFF, PROMPT_LOOKUP])
        self.speculation_combo.addItems([f"Draft: {label}" for label, _n, _s in self._drafts])
        self.speculation_combo.setCurrentText(current)
        self.speculation_combo.blockSignals(False)
        self._on_choice_changed(None)

    def set_speculation(self, speculation: SpeculationChoice) -> None:
        """Show a choice made before (the last load's draft, prompt lookup), where offered."""
        names = [name for _label, name, _shape in self._drafts]
        if speculation.draft in names:
            self.speculation_combo.setCurrentIndex(2 + names.index(speculation.draft))
        else:
            self.speculation_combo.setCurrentIndex(1 if speculation.prompt_lookup else 0)
        self.speculative_spin.setValue(speculation.num_speculative_tokens or 0)

    def speculation(self) -> SpeculationChoice:
        index = self.speculation_combo.currentIndex()
        k = self.speculative_spin.value() or None
        if index == 1:
            return SpeculationChoice(prompt_lookup=True, num_speculative_tokens=k)
        if index >= 2:
            return SpeculationChoice(draft=self._drafts[index - 2][1], num_speculative_tokens=k)
        return SpeculationChoice()

    def reproducible(self) -> bool | None:
        """LoadRequest.reproducible: on where ticked, else the device's default (off)."""
        return True if self.reproducible_check.isChecked() else None

    def tensor_parallel(self) -> int:
        """GPUs to cut the model across (LoadRequest.tensor_parallel); 1 with one GPU."""
        return self.gpus_spin.value()

    def choice(self) -> tuple[str, str, int | None]:
        """(quant, kv_dtype, context) as chosen; context None when nothing is planned."""
        context = self.context_spin.value() if self.shape is not None else None
        return self.quant_combo.currentText(), self.kv_combo.currentText(), context

    # ------------------------------------------------------------------ slots

    def _on_choice_changed(self, _value) -> None:
        self.speculative_spin.setEnabled(self.speculation_combo.currentIndex() > 0)
        self._replan()

    def _on_fit_table_cell_clicked(self, row: int, _column: int) -> None:
        self.quant_combo.setCurrentText(self.fit_table.item(row, 0).text())

    # ------------------------------------------------------------------ helpers

    def _show_gpu(self) -> None:
        num = len(self.gpu_report.gpus) if self.gpu_report is not None else 0
        self.gpus_spin.setRange(1, max(1, num))
        self.form.setRowVisible(self.gpus_spin, num >= 2)
        gpu = fit_check.first_gpu(self.gpu_report)
        if self.gpu_report is None:
            self.gpu_label.setText("Looking for a GPU…")
        elif gpu is None:
            ram = fit_check.cpu_memory(self.gpu_report)
            on_cpu = f" Models run on the CPU: {ram / GiB:.1f} GiB of memory free." if ram else ""
            self.gpu_label.setText(f"No GPU: {self.gpu_report.reason.rstrip('.')}.{on_cpu}")
        else:
            more = f"; {num} GPUs in all" if num >= 2 else ""
            self.gpu_label.setText(
                f"{gpu.name}: {gpu.free_bytes / GiB:.1f} GiB free of {gpu.total_bytes / GiB:.1f} "
                f"GiB (driver {gpu.driver_version or 'unknown'}){more}")

    def _replan(self, preselect: bool = False) -> None:
        self.fit_table.setRowCount(0)
        self.table_data = None
        if self.shape is None:
            self.recommendation_label.setText("")
            self.split_label.setText("")
            self.verdict_label.setText("")
            self.sig_plan_changed.emit(False)  # a folder the planner cannot read won't load
            return
        gpu = fit_check.first_gpu(self.gpu_report)
        kv, context = self.kv_combo.currentText(), self.context_spin.value()
        try:
            split = split_check.advice(self.shape, self.gpu_report, kv, context)
            if preselect:  # the split where this machine can run it, else one GPU
                self.gpus_spin.blockSignals(True)
                self.gpus_spin.setValue(split.num_devices if split and split.runs_here else 1)
                self.gpus_spin.blockSignals(False)
            self.split_label.setText(f"Several GPUs: {split.text}." if split else "")
            n = self.gpus_spin.value()
            if n > 1:
                table = split_check.fit_table(self.shape, self.gpu_report, n, kv, context)
            else:
                table = fit_check.fit_table(self.shape, gpu, kv, context, self._draft_shape(),
                                            fit_check.cpu_memory(self.gpu_report))
            if preselect and self.quant_combo.findText(table.recommended_quant) >= 0:
                self.quant_combo.blockSignals(True)
                self.quant_combo.setCurrentText(table.recommended_quant)
                self.quant_combo.blockSignals(False)
            self._show_verdict(table)
        except PlanError as e:
            self.verdict_label.setText(str(e))
            self.sig_plan_changed.emit(False)
            return
        self.table_data = table
        for row in table.rows:
            self._add_fit_row(row)
        note = f" {table.note}" if table.note else ""
        if self.gpus_spin.value() > 1 and self._draft_shape() is not None:
            note += " The draft model stays off: it does not run beside tensor parallelism yet."
        self.recommendation_label.setText(
            f"Recommended: {table.recommended_quant} weights, {table.recommended_kv_dtype} KV "
            f"cache, {table.recommended_context:,} tokens.{note}")
        self.sig_plan_changed.emit(True)

    def _draft_shape(self):
        index = self.speculation_combo.currentIndex()
        return self._drafts[index - 2][2] if index >= 2 else None

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
        n, kv = self.gpus_spin.value(), self.kv_combo.currentText()
        context = self.context_spin.value()
        if row is None and n > 1:  # fp16 is not a table row
            row = split_check.fit_row(self.shape, self.gpu_report, n, quant, kv, context)
        elif row is None:
            row = fit_check.fit_row(self.shape, fit_check.first_gpu(self.gpu_report), quant, kv,
                                    context, self._draft_shape(),
                                    fit_check.cpu_memory(self.gpu_report))
        verdict = {True: "fits", False: "does not fit", None: "runs on the CPU"}[row.fits]
        self.verdict_label.setText(f"{row.reason}: {verdict}.")
        self.verdict_label.setProperty("fits", FIT_WORDS[row.fits])
        self.verdict_label.style().unpolish(self.verdict_label)
        self.verdict_label.style().polish(self.verdict_label)


def params_text(num_params: int) -> str:
    """7.62 B, 494 M, 5.1 M: a model's parameter count as model cards write it."""
    if num_params >= 1e9:
        return f"{num_params / 1e9:.2f} B"
    if num_params >= 1e8:
        return f"{num_params / 1e6:.0f} M"
    return f"{num_params / 1e6:.1f} M"
