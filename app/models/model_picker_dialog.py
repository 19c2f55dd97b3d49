"""Pick a model and how to load it, and see before loading whether it fits this card: models
from the bundled demo, Hearth's imports, the local Hugging Face cache and added folders, or a Hub
repo checked before it is downloaded, or a model of an OpenAI-compatible endpoint. The fit is the
FitPanel's; the download the GetModelPanel's; a GGUF import the GGUFImportPanel's; endpoints the
EndpointPanel's. Each model is listed with its size, parameters, architecture and formats, and
the list can be searched; a folder without config.json is refused, with the reason."""

from __future__ import annotations

from pathlib import Path

from PySide6.QtCore import Qt
from PySide6.QtWidgets import (
    QDialog,
    QDialogButtonBox,
    QFileDialog,
    QHBoxLayout,
    QLineEdit,
    QListWidget,
    QListWidgetItem,
    QPushButton,
    QVBoxLayout,
)

from app.app_settings import AppSettings
from app.get_model.get_model_panel import GetModelPanel, size_text
from app.get_model.gguf_import_job import GGUFImportJob, ImportResult
from app.get_model.gguf_import_panel import GGUFImportPanel
from app.get_model.model_download import ModelDownload
from app.models import fit_check
from app.models.fit_panel import FitPanel
from app.models.model_catalog import ModelEntry, all_entries, demo_draft_entry
from app.models.model_choice import recommended_entry
from app.models.model_facts import facts_line
from app.remote.endpoint_keys import EndpointKeys
from app.remote.endpoint_panel import EndpointPanel
from app.remote.endpoints import EndpointBook, EndpointModel
from engine.events import LoadRequest
from engine.files import model_home
from engine.files.hub_listing import RepoListing
from engine.plan.memory import PlanError
from engine.platform.gpu import GpuReport

ENTRY_ROLE = Qt.ItemDataRole.UserRole


class ModelPickerDialog(QDialog):
    def __init__(self, settings: AppSettings, gpu_report: GpuReport | None = None,
                 hub: Path | None = None, download: ModelDownload | None = None,
                 gguf_import: GGUFImportJob | None = None,
                 endpoint_keys: EndpointKeys | None = None, parent=None) -> None:
        super().__init__(parent)
        self.setWindowTitle("Choose a model")
        self.resize(980, 760)
        self.settings = settings
        self.hub = hub
        self.remote: RepoListing | None = None  # a Hub repo shown instead of a local model
        self.remote_model: EndpointModel | None = None  # an endpoint's model, chosen instead
        self._shapes: dict[Path, object] = {}  # folder -> ModelShape, or None when unreadable

        self.search_edit = QLineEdit()
        self.search_edit.setPlaceholderText("Search the models listed")
        self.search_edit.setClearButtonEnabled(True)
        self.model_list = QListWidget()
        self.add_button = QPushButton("Add folder…")
        self.remove_button = QPushButton("Remove")
        self.get_model_panel = GetModelPanel(download or ModelDownload(hub, self))
        self.gguf_import_panel = GGUFImportPanel(gguf_import or GGUFImportJob(parent=self))
        # the keys outlive the picker: without a keyring they are held for the session only
        self.endpoint_panel = EndpointPanel(EndpointBook(settings,
                                                         endpoint_keys or EndpointKeys()))
        self.fit_panel = FitPanel(gpu_report)
        self.buttons = QDialogButtonBox(
            QDialogButtonBox.StandardButton.Ok | QDialogButtonBox.StandardButton.Cancel)
        self.load_button = self.buttons.button(QDialogButtonBox.StandardButton.Ok)
        self.load_button.setText("Load")

        left = QVBoxLayout()
        left.addWidget(self.search_edit)
        left.addWidget(self.model_list, 1)
        row = QHBoxLayout()
        row.addWidget(self.add_button)
        row.addWidget(self.remove_button)
        left.addLayout(row)
        left.addWidget(self.endpoint_panel)
        left.addWidget(self.gguf_import_panel)
        left.addWidget(self.get_model_panel)
        body = QHBoxLayout()
        body.addLayout(left, 1)
        body.addWidget(self.fit_panel, 1)
        layout = QVBoxLayout(self)
        layout.addLayout(body, 1)
        layout.addWidget(self.buttons)

        self.search_edit.textChanged.connect(self._on_search_edit_text_changed)
        self.model_list.currentItemChanged.connect(self._on_model_list_current_item_changed)
        self.model_list.itemDoubleClicked.connect(self._on_model_list_item_double_clicked)
        self.add_button.clicked.connect(self._on_add_button_clicked)
        self.remove_button.clicked.connect(self._on_remove_button_clicked)
        self.get_model_panel.sig_listing_shown.connect(self._on_get_model_panel_listing_shown)
        self.get_model_panel.sig_downloaded.connect(self._on_get_model_panel_downloaded)
        self.gguf_import_panel.sig_imported.connect(self._on_gguf_import_panel_imported)
        self.fit_panel.sig_plan_changed.connect(self._on_fit_panel_plan_changed)
        self.endpoint_panel.sig_model_chosen.connect(self._on_endpoint_panel_model_chosen)
        self.buttons.accepted.connect(self.accept)
        self.buttons.rejected.connect(self.reject)
        self._fill_models()

    # ------------------------------------------------------------------ public

    @property
    def download(self) -> ModelDownload:
        return self.get_model_panel.download

    @property
    def gguf_import(self) -> GGUFImportJob:
        return self.gguf_import_panel.job

    def set_gpu_report(self, report: GpuReport) -> None:
        self.fit_panel.set_gpu_report(report)
        entry = self.selected_entry()
        if self.settings.last_load() is None and entry is not None and (
                entry.source == "demo" or _same_folder(entry.folder, model_home.starter_dir())):
            # a first run whose card was detected after the dialog opened: choose again
            chosen = recommended_entry(
                [self.model_list.item(i).data(ENTRY_ROLE) for i in range(self.model_list.count())],
                report)
            if chosen is not None:
                self._fill_models(select=chosen.folder)

    def add_folder(self, folder: Path) -> bool:
        """Add a model folder; one without config.json is refused, saying why (False)."""
        if not (folder / "config.json").is_file():
            self.model_list.setCurrentItem(None)
            ggufs = sorted(folder.glob("*.gguf")) if folder.is_dir() else []
            hint = (f" It holds {ggufs[0].name}: import GGUF files below." if ggufs else "")
            self.fit_panel.show_nothing(
                f"{folder} has no config.json, so it is not a model folder Hearth can load; it "
                f"was not added.{hint}")
            return False
        folders = self.settings.model_folders()
        if folder not in folders:
            self.settings.set_model_folders([*folders, folder])
        self._fill_models(select=folder)
        return True

    def selected_entry(self) -> ModelEntry | None:
        item = self.model_list.currentItem()
        return item.data(ENTRY_ROLE) if item is not None else None

    def remote_choice(self) -> EndpointModel | None:
        """The endpoint's model chosen instead of a local one (load_request() is None then)."""
        return self.remote_model

    def load_request(self) -> LoadRequest | None:
        entry = self.selected_entry()
        if entry is None:
            return None
        quant, kv_dtype, context = self.fit_panel.choice()
        speculation = self.fit_panel.speculation()
        tp = self.fit_panel.tensor_parallel()
        draft = speculation.draft if tp == 1 else None  # no draft beside tensor parallelism yet
        return LoadRequest(model=entry.load_name, quant=quant, kv_dtype=kv_dtype, context=context,
                           draft=draft,
                           num_speculative_tokens=speculation.num_speculative_tokens
                           if draft else None, tensor_parallel=tp,
                           reproducible=self.fit_panel.reproducible())

    # ------------------------------------------------------------------ slots

    def _on_model_list_current_item_changed(self, item, _previous) -> None:
        self.remove_button.setEnabled(item is not None and item.data(ENTRY_ROLE).source == "folder")
        if item is None:
            if self.remote is None:
                self.fit_panel.show_nothing("No model chosen.")
            return
        self.remote = None
        self.remote_model = None
        self.endpoint_panel.clear_choice()
        entry: ModelEntry = item.data(ENTRY_ROLE)
        try:
            shape = fit_check.model_shape(entry.folder)
        except PlanError as e:
            self.fit_panel.show_nothing(f"{entry.label}: {e}")
            return
        self.fit_panel.set_drafts(self._drafts_for(shape, entry.folder))
        self.fit_panel.show_shape(shape, entry.label)

    def _on_search_edit_text_changed(self, text: str) -> None:
        words = text.lower().split()
        for i in range(self.model_list.count()):
            item = self.model_list.item(i)
            haystack = f"{item.text()} {item.toolTip()}".lower()
            item.setHidden(not all(w in haystack for w in words))

    def _on_model_list_item_double_clicked(self, _item) -> None:
        if self.load_button.isEnabled():
            self.accept()

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

    def _on_get_model_panel_listing_shown(self, listing: RepoListing) -> None:
        """Show the fit of a repo not downloaded yet, from its config.json."""
        self.remote = listing
        self.remote_model = None
        self.endpoint_panel.clear_choice()
        self.model_list.setCurrentItem(None)  # what the right side shows is not in the list
        detail = f"On the Hub, not downloaded: {size_text(listing.weights_bytes)} of weights"
        try:
            shape = fit_check.shape_from_config(listing.config)
        except PlanError as e:
            self.fit_panel.show_nothing(f"{listing.repo_id}: {e}")
            return
        self.fit_panel.set_drafts(self._drafts_for(shape, None))
        self.fit_panel.show_shape(shape, listing.repo_id, detail)

    def _on_get_model_panel_downloaded(self, snapshot: Path) -> None:
        self._fill_models(select=snapshot)

    def _on_gguf_import_panel_imported(self, result: ImportResult) -> None:
        self._fill_models(select=result.folder)

    def _on_fit_panel_plan_changed(self, has_plan: bool) -> None:
        # a Hub repo is downloaded first; a folder the planner cannot read won't load; an
        # endpoint's model needs no plan here
        self.load_button.setEnabled(has_plan and self.selected_entry() is not None
                                    or self.remote_model is not None)

    def _on_endpoint_panel_model_chosen(self, choice: EndpointModel | None) -> None:
        if choice is None:
            if self.remote_model is not None:
                self.remote_model = None
                self.fit_panel.show_nothing("No model chosen.")
            return
        self.remote = None
        self.model_list.setCurrentItem(None)
        self.remote_model = choice
        context = f", with {choice.context:,} tokens of context" if choice.context else ""
        self.fit_panel.show_nothing(f"{choice.model} runs on the endpoint at {choice.where}"
                                    f"{context}: nothing of it has to fit this machine.")

    # ------------------------------------------------------------------ helpers

    def _drafts_for(self, target, folder: Path | None) -> list[tuple[str, str, object]]:
        """Local models that could draft for `target`: the bundled demo draft and any other
        listed model with the same vocabulary and fewer parameters."""
        entries = [e for e in (demo_draft_entry(), *(self.model_list.item(i).data(ENTRY_ROLE)
                                                      for i in range(self.model_list.count())))
                   if e is not None and e.folder != folder]
        drafts = []
        for entry in entries:
            shape = self._shape(entry.folder)
            if shape is not None and fit_check.can_draft_for(shape, target):
                drafts.append((entry.label, str(entry.folder), shape))
        return drafts

    def _fill_models(self, select: Path | None = None) -> None:
        last = self.settings.last_load()
        self.model_list.blockSignals(True)  # one selection change, once the list is whole
        self.model_list.clear()
        entries = all_entries(self.settings.model_folders(), self.hub)
        if select is None and last is None:  # a first run: the best model this card runs
            chosen = recommended_entry(entries, self.fit_panel.gpu_report)
            select = chosen.folder if chosen is not None else None
            default = model_home.default_model()  # as the window and `hearth run` decide
            if select is None and default is not None:
                select = Path(default)
        for entry in entries:
            item = QListWidgetItem(f"{entry.label}  ({entry.source})\n"
                                   f"{facts_line(entry.folder, self._shape(entry.folder))}")
            item.setToolTip(str(entry.folder))
            item.setData(ENTRY_ROLE, entry)
            self.model_list.addItem(item)
            is_last = select is None and last is not None and last.model == entry.load_name
            if _same_folder(entry.folder, select) or is_last:
                self.model_list.setCurrentItem(item)
        if self.model_list.currentItem() is None and self.model_list.count():
            self.model_list.setCurrentRow(0)
        self.model_list.blockSignals(False)
        self._on_model_list_current_item_changed(self.model_list.currentItem(), None)
        if not self.model_list.count():
            self.fit_panel.show_nothing("No models found: add a model folder (with config.json).")
        self._on_search_edit_text_changed(self.search_edit.text())

    def _shape(self, folder: Path):
        """The folder's ModelShape, read once; None where the planner cannot read it."""
        if folder not in self._shapes:
            try:
                self._shapes[folder] = fit_check.model_shape(folder)
            except PlanError:
                self._shapes[folder] = None
        return self._shapes[folder]


def _same_folder(a: Path, b: Path | None) -> bool:
    """The import reports its folder resolved; the catalogue lists it as found."""
    if b is None:
        return False
    if a == b:
        return True
    try:
        return a.resolve() == b.resolve()
    except (OSError, RuntimeError):
        return False
