"""The main window's model picker: opening it, loading what it chose (here or on an endpoint),
and telling of downloads and imports that end while it is closed. A part of MainWindow."""

from __future__ import annotations

from app.models.fit_panel import SpeculationChoice
from app.models.model_picker_dialog import ModelPickerDialog
from engine.events import LoadRequest


class PickerWiring:
    """MainWindow's picker slots (it has picker, settings, gpu_probe, controller, notice...)."""

    def open_model_picker(self) -> None:
        if self.picker is not None:
            self.picker.deleteLater()
        self.picker = ModelPickerDialog(self.settings, self.gpu_probe.report,
                                        download=self.model_download,
                                        gguf_import=self.gguf_import,
                                        endpoint_keys=self.endpoint_keys, parent=self)
        self.picker.fit_panel.set_speculation(self._speculation_in_force())
        self.picker.accepted.connect(self._on_picker_accepted)
        self.picker.open()

    def _speculation_in_force(self) -> SpeculationChoice:
        if self.controller.prompt_lookup:
            return SpeculationChoice(prompt_lookup=True,
                               num_speculative_tokens=self.controller.num_speculative_tokens)
        last = self.last_load or LoadRequest()
        return SpeculationChoice(draft=last.draft,
                                 num_speculative_tokens=last.num_speculative_tokens)

    def _on_picker_accepted(self) -> None:
        remote = self.picker.remote_choice() if self.picker is not None else None
        if remote is not None:
            self.load_remote(remote)
            return
        request = self.picker.load_request() if self.picker is not None else None
        if request is not None:
            speculation = self.picker.fit_panel.speculation()
            self.controller.prompt_lookup = speculation.prompt_lookup  # sent with each answer
            self.controller.num_speculative_tokens = speculation.num_speculative_tokens
            self.load(request)

    def _on_gpu_probe_report(self, report) -> None:
        self.performance_panel.set_gpu_report(report)
        if self.picker is not None and self.picker.isVisible():
            self.picker.set_gpu_report(report)

    def _on_model_download_downloaded(self, snapshot) -> None:
        if self.picker is None or not self.picker.isVisible():
            listing = self.model_download.listing
            name = listing.repo_id if listing is not None else str(snapshot)
            self.notice.show_message(f"{name} is downloaded; choose it in the model picker "
                                     "(Ctrl+L).", is_error=False)

    def _on_chat_view_get_model_requested(self) -> None:
        self.open_model_picker()
        self.picker.get_model_panel.repo_edit.setFocus()

    def _on_gguf_import_imported(self, result) -> None:
        if self.picker is None or not self.picker.isVisible():
            self.notice.show_message(f"{result.folder.name} is imported; choose it in the model "
                                     "picker (Ctrl+L).", is_error=False)
