"""Import a GGUF file: one chosen in a file dialog, or one LM Studio or Ollama already holds
(listed with its size, each with its own Import button), with the import's stages, a cancel,
and at the end what the import did to the weights. The import itself is GGUFImportJob's."""

from __future__ import annotations

from pathlib import Path

from PySide6.QtCore import Signal
from PySide6.QtWidgets import (
    QAbstractItemView,
    QFileDialog,
    QGroupBox,
    QHBoxLayout,
    QHeaderView,
    QLabel,
    QProgressBar,
    QPushButton,
    QTableWidget,
    QTableWidgetItem,
    QVBoxLayout,
)

from app.get_model.get_model_panel import size_text
from app.get_model.gguf_import_job import GGUFImportJob, ImportProgress, ImportResult
from app.get_model.gguf_sources import GGUFSource, find_gguf_files

NAME, SIZE, ORIGIN, ACTION = range(4)


class GGUFImportPanel(QGroupBox):
    sig_imported = Signal(object)
    """An import finished: its ImportResult (the picker lists and selects the new folder)."""

    def __init__(self, job: GGUFImportJob, parent=None) -> None:
        super().__init__("Import a GGUF file (LM Studio, Ollama, llama.cpp)", parent)
        self.job = job
        self.sources: list[GGUFSource] = []

        self.sources_table = QTableWidget(0, 4)
        self.sources_table.setHorizontalHeaderLabels(["GGUF file on disk", "Size", "From", ""])
        self.sources_table.setEditTriggers(QAbstractItemView.EditTrigger.NoEditTriggers)
        self.sources_table.setSelectionMode(QAbstractItemView.SelectionMode.NoSelection)
        self.sources_table.verticalHeader().setVisible(False)
        header = self.sources_table.horizontalHeader()
        header.setSectionResizeMode(NAME, QHeaderView.ResizeMode.Stretch)
        for column in (SIZE, ORIGIN, ACTION):
            header.setSectionResizeMode(column, QHeaderView.ResizeMode.ResizeToContents)
        self.empty_label = QLabel("No GGUF files in LM Studio's or Ollama's model folders.")
        self.import_file_button = QPushButton("Import GGUF…")
        self.status_label = QLabel("The weights are made 16-bit on import; 4-bit formats are "
                                   "offered when the model is loaded.")
        self.status_label.setWordWrap(True)
        self.progress_bar = QProgressBar()
        self.cancel_button = QPushButton("Cancel import")
        actions = QHBoxLayout()
        actions.addWidget(self.progress_bar, 1)
        actions.addWidget(self.cancel_button)
        actions.addWidget(self.import_file_button)
        layout = QVBoxLayout(self)
        layout.addWidget(self.sources_table)
        layout.addWidget(self.empty_label)
        layout.addWidget(self.status_label)
        layout.addLayout(actions)

        self.import_file_button.clicked.connect(self._on_import_file_button_clicked)
        self.cancel_button.clicked.connect(self._on_cancel_button_clicked)
        job.sig_progress.connect(self._on_job_progress)
        job.sig_imported.connect(self._on_job_imported)
        job.sig_failed.connect(self._on_job_failed)
        job.sig_cancelled.connect(self._on_job_cancelled)
        job.sig_busy_changed.connect(self._on_job_busy_changed)
        self.refresh_sources()
        self._on_job_busy_changed(job.is_busy)  # a picker reopened while an import runs
        if job.is_busy and job.progress is not None:
            self._on_job_progress(job.progress)

    # ------------------------------------------------------------------ public

    def refresh_sources(self) -> None:
        """List the GGUF files LM Studio and Ollama hold, one row each with an Import button."""
        self.sources = find_gguf_files()
        self.sources_table.setRowCount(len(self.sources))
        for row, source in enumerate(self.sources):
            name = QTableWidgetItem(source.label)
            name.setToolTip(str(source.path))
            self.sources_table.setItem(row, NAME, name)
            self.sources_table.setItem(row, SIZE, QTableWidgetItem(size_text(source.size_bytes)))
            self.sources_table.setItem(row, ORIGIN, QTableWidgetItem(source.origin))
            button = QPushButton("Import")
            button.setEnabled(not self.job.is_busy)
            button.clicked.connect(lambda _checked=False, p=source.path: self.import_file(p))
            self.sources_table.setCellWidget(row, ACTION, button)
        self.sources_table.setVisible(bool(self.sources))
        self.empty_label.setVisible(not self.sources)

    def import_file(self, path: Path) -> None:
        if self.job.is_busy:
            return  # one import at a time: the buttons say so by being disabled
        self.status_label.setText(f"Importing {Path(path).name}…")
        self.progress_bar.setRange(0, 0)  # busy until the first stage arrives
        self.job.start(Path(path))

    def import_buttons(self) -> list[QPushButton]:
        return [self.import_file_button, *(self.sources_table.cellWidget(r, ACTION)
                                           for r in range(self.sources_table.rowCount()))]

    # ------------------------------------------------------------------ slots

    def _on_import_file_button_clicked(self) -> None:
        path, _filter = QFileDialog.getOpenFileName(
            self, "Import a GGUF file", "", "GGUF files (*.gguf);;All files (*)")
        if path:
            self.import_file(Path(path))

    def _on_cancel_button_clicked(self) -> None:
        self.job.cancel()

    def _on_job_progress(self, progress: ImportProgress) -> None:
        self.progress_bar.setRange(0, max(progress.total, 1))
        self.progress_bar.setValue(progress.done)
        name = self.job.source.name if self.job.source is not None else "the file"
        self.status_label.setText(f"Importing {name}: {progress.stage} "
                                  f"({progress.done}/{progress.total})…")

    def _on_job_imported(self, result: ImportResult) -> None:
        self.status_label.setText(import_note(result))
        self.sig_imported.emit(result)

    def _on_job_failed(self, error: str) -> None:
        self.status_label.setText(f"Import failed: {error}")

    def _on_job_cancelled(self) -> None:
        self.status_label.setText("Import cancelled; nothing of it was kept.")

    def _on_job_busy_changed(self, busy: bool) -> None:
        self.cancel_button.setVisible(busy)
        self.progress_bar.setVisible(busy)
        for button in self.import_buttons():
            button.setEnabled(not busy)


def import_note(result: ImportResult) -> str:
    """What the import did to the weights, and what loading it 4-bit takes."""
    size = size_text(result.weights_bytes)
    grown = (f", about {result.growth:.1f}x the GGUF's {size_text(result.gguf_bytes)} on disk"
             if result.growth else "")
    return (f"Imported {result.folder.name}: its weights are now 16-bit ({size}{grown}). "
            "The 4-bit formats, NF4 and AWQ, are offered when you load it.")
