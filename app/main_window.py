"""The main window: assembles the sidebar, the chat, the performance and server panels and the
model strip, and routes the worker's (or an endpoint's) load and crash events to them. Behaviour
lives in the parts (menus and docks: window_menus.py; the model picker: window_picker.py)."""

from __future__ import annotations

from pathlib import Path

from PySide6.QtCore import Qt, Signal
from PySide6.QtWidgets import QMainWindow, QSplitter, QVBoxLayout, QWidget

from app.app_settings import AppSettings
from app.chat.chat_controller import ChatController
from app.chat.chat_view import ChatView
from app.chat.conversation_list_view import ConversationListView
from app.chat.conversation_settings_dialog import ConversationSettingsDialog
from app.crash_report import engine_error
from app.get_model.gguf_import_job import GGUFImportJob
from app.get_model.model_download import ModelDownload
from app.history.conversation_store import ConversationStore
from app.models.model_picker_dialog import ModelPickerDialog
from app.models.model_status_panel import ModelStatusPanel
from app.paths import DEMO_MODEL_DIR
from app.remote.endpoint_client import EndpointClient, RemoteLoad
from app.remote.endpoint_keys import EndpointKeys
from app.remote.endpoints import EndpointModel
from app.server.server_panel import ServerPanel
from app.widgets.notice_panel import NoticePanel
from app.widgets.theme import Theme
from app.window_menus import RESTART, build_docks, build_menus
from app.window_picker import PickerWiring
from app.worker.gpu_probe import GpuProbe
from app.worker.performance_panel import PerformancePanel
from app.worker.worker_client import WorkerClient, WorkerDied
from engine.events import Failed, Finished, Loaded, LoadRequest

DEMO_NOTICE = "Hearth is running its bundled 5M-parameter demo model on the CPU."
SIDEBAR_MIN_WIDTH = 170


class MainWindow(PickerWiring, QMainWindow):
    sig_closed = Signal()
    """The window has closed for good (its worker has ended): the app may quit."""

    def __init__(self, store: ConversationStore, worker: WorkerClient, settings: AppSettings,
                 gpu_probe: GpuProbe | None = None) -> None:
        super().__init__()
        self.setWindowTitle("Hearth")
        self.resize(1280, 800)
        self.store, self.worker, self.settings = store, worker, settings
        self.gpu_probe = gpu_probe or GpuProbe(self)
        self.last_load: LoadRequest | None = None
        self.last_remote: EndpointModel | None = None  # the endpoint's model in use, if any
        self.endpoint_keys = EndpointKeys()  # outlives the picker: a session's keys, no keyring
        self.endpoint_client = EndpointClient(self)
        self._is_closing = False
        self.picker: ModelPickerDialog | None = None
        self.model_download = ModelDownload(parent=self)  # outlives the picker: closing it
        # while a download runs leaves the download running
        self.gguf_import = GGUFImportJob(parent=self)  # likewise for an import
        self.theme = Theme(settings.theme(), self)

        self.controller = ChatController(store, worker, self)
        self.notice = NoticePanel()
        self.storage_notice = NoticePanel()  # its own banner: engine notices must not hide it
        self.conversation_list = ConversationListView(self.controller)
        self.chat_view = ChatView(self.controller)
        self.performance_panel = PerformancePanel()
        self.model_status = ModelStatusPanel()
        splitter = QSplitter()
        splitter.addWidget(self.conversation_list)
        splitter.addWidget(self.chat_view)
        splitter.setStretchFactor(1, 1)
        splitter.setSizes([240, 900])
        central = QWidget()
        layout = QVBoxLayout(central)
        # in the layout, above the content: a banner covers none of the sidebar's controls
        layout.addWidget(self.storage_notice)
        layout.addWidget(self.notice)
        layout.addWidget(splitter, 1)
        self.setCentralWidget(central)
        self.server_panel = ServerPanel(worker, settings)
        build_docks(self)
        self.conversation_list.setMinimumWidth(SIDEBAR_MIN_WIDTH)
        self.statusBar().addPermanentWidget(self.model_status, 1)
        build_menus(self)
        geometry = settings.geometry()
        if geometry is not None:
            self.restoreGeometry(geometry)

        worker.sig_load_progress.connect(self.model_status.show_progress)
        worker.sig_loaded.connect(self._on_worker_loaded)
        worker.sig_failed.connect(self._on_worker_failed)
        worker.sig_stats.connect(self.performance_panel.add_stats)
        worker.sig_finished.connect(self._on_worker_finished)
        worker.sig_worker_died.connect(self._on_worker_worker_died)
        worker.sig_stopped.connect(self._on_worker_stopped)
        remote = self.endpoint_client
        remote.sig_load_progress.connect(self.model_status.show_progress)
        remote.sig_loaded.connect(self._on_endpoint_client_loaded)
        remote.sig_failed.connect(self._on_endpoint_client_failed)
        remote.sig_stats.connect(self.performance_panel.add_stats)
        remote.sig_finished.connect(self._on_worker_finished)
        self.controller.sig_error.connect(self._on_controller_error)
        self.controller.sig_context_trimmed.connect(self._on_controller_context_trimmed)
        self.notice.sig_action_triggered.connect(self._on_notice_action_triggered)
        self.model_status.sig_choose_requested.connect(self.open_model_picker)
        self.model_status.sig_cancel_requested.connect(self._on_model_status_cancel_requested)
        self.chat_view.sig_settings_requested.connect(self._on_chat_view_settings_requested)
        self.conversation_list.sig_settings_requested.connect(self.open_conversation_settings)
        self.gpu_probe.sig_report.connect(self._on_gpu_probe_report)
        self.gpu_probe.sig_vram_sample.connect(self.performance_panel.add_vram_sample)
        self.model_download.sig_downloaded.connect(self._on_model_download_downloaded)
        self.gguf_import.sig_imported.connect(self._on_gguf_import_imported)
        self.chat_view.sig_get_model_requested.connect(self._on_chat_view_get_model_requested)
        self.chat_view.set_sends_on_ctrl_enter(settings.sends_on_ctrl_enter())
        self.theme.sig_changed.connect(self.performance_panel.set_dark)
        self.theme.apply()

    # ------------------------------------------------------------------ public

    def start(self, request: LoadRequest) -> None:
        """Show the latest conversation, look for a GPU, and start loading `request`."""
        self.controller.show_latest_or_new()
        self.gpu_probe.detect()
        if self.store.num_interrupted:
            self.notice.show_message(
                f"{self.store.num_interrupted} answer(s) were cut off when Hearth last closed; "
                "they are kept and marked as interrupted.", is_error=False)
        self.load(request)

    def set_theme(self, mode: str) -> None:
        """"system", "light" or "dark", kept for the next start."""
        self.settings.set_theme(mode)
        self.theme.set_mode(mode)

    def show_storage_notice(self, text: str) -> None:
        """Where the conversations are kept when it is not as usual (store_opening.py)."""
        self.storage_notice.show_message(text)

    def load(self, request: LoadRequest) -> None:
        self._use_client(self.worker)
        self.last_remote = None
        if self.worker.busy is not None:
            self.worker.kill()  # a load or a generation in the way: a fresh worker is quickest
        # else the worker frees the old model's VRAM itself before it loads the new one
        self.last_load = request
        self.controller.clear_model()
        self.server_panel.set_has_model(False)
        self.model_status.show_loading(request.model or "the demo model")
        self.worker.send(request)
        self.chat_view.show_model_state()

    def load_remote(self, choice: EndpointModel) -> None:
        """Answer from an endpoint's model; the local worker ends, freeing this machine's VRAM."""
        self._use_client(self.endpoint_client)
        self.last_remote = choice
        self.model_status.show_loading(f"{choice.model} on {choice.where}")
        self.endpoint_client.send(RemoteLoad(choice.base_url, choice.model,
                                             self.endpoint_keys.get(choice.base_url)))
        self.chat_view.show_model_state()
        if self.endpoint_keys.notice:
            self.notice.show_message(self.endpoint_keys.notice, is_error=False)

    def _use_client(self, client) -> None:
        """End what the other client does (its answer is kept as interrupted), then answer
        through `client`."""
        if client is self.endpoint_client:
            self.worker.kill()
        self.endpoint_client.kill()  # a remote model is asked for anew at each choice
        self.controller.set_client(client)

    def open_conversation_settings(self, conversation_id: int) -> ConversationSettingsDialog:
        loaded = self.controller.loaded  # the defaults it shows are this model's
        dialog = ConversationSettingsDialog(self.store.conversation(conversation_id), self,
                                            loaded.sampling if loaded is not None else {})
        dialog.setAttribute(Qt.WidgetAttribute.WA_DeleteOnClose)
        dialog.accepted.connect(lambda: self._on_settings_dialog_accepted(dialog))
        dialog.open()
        return dialog

    # ------------------------------------------------------------------ slots

    def _on_worker_loaded(self, event: Loaded) -> None:
        self.model_status.show_loaded(event)
        self.server_panel.set_has_model(True)
        self.performance_panel.set_loaded(event)
        self.gpu_probe.watch(event.pid or self.worker.pid)
        if self.last_load is not None:
            self.settings.set_last_load(self.last_load)
        if self.notice.text.startswith(DEMO_NOTICE):  # another model now: no longer true
            self.notice.hide()
        if event.device == "cpu" and Path(event.model).resolve() == DEMO_MODEL_DIR.resolve():
            # first run with no GPU and no model: say what this is and what would be better
            self.notice.show_message(
                DEMO_NOTICE,
                "An NVIDIA GPU and a downloaded model (Get a model, in the model picker) give "
                "real answers at full speed; `hearth import --starter` brings a small real "
                "model that runs on the CPU.", is_error=False)

    def _on_endpoint_client_loaded(self, event: Loaded) -> None:
        self.model_status.show_remote(event.model, event.device, event.context)
        self.performance_panel.set_remote(event.device)

    def _on_endpoint_client_failed(self, event: Failed) -> None:
        if self.endpoint_client.ended_command == "load":
            self.model_status.show_unloaded("No model in use (the endpoint could not be used)")
            self.chat_view.show_model_state()
            self.notice.show_message(f"Could not use the endpoint's model: {event.error}",
                                     event.hint)

    def _on_worker_failed(self, event: Failed) -> None:
        if self.worker.ended_command == "load":
            self.server_panel.set_has_model(False)
            self.model_status.show_unloaded("No model loaded (the load failed)")
            self.chat_view.show_model_state()
            self.notice.show_message(f"Could not load the model: {event.error}", event.hint)

    def _on_worker_finished(self, event: Finished) -> None:
        self.performance_panel.add_stats(event.stats)

    def _on_worker_worker_died(self, event: WorkerDied) -> None:
        self.gpu_probe.watch(0)
        self.server_panel.set_has_model(False)
        self.model_status.show_unloaded("No model loaded (the engine stopped)")
        error = engine_error(event.stderr_tail)  # the real error, not the last warning
        self.notice.show_message(event.message + (f" The engine said: {error}" if error else ""),
                                 action=RESTART)

    def _on_worker_stopped(self) -> None:
        self.gpu_probe.watch(0)
        self.server_panel.set_has_model(False)
        if self._is_closing:
            self.close()

    def _on_controller_error(self, event: Failed) -> None:
        self.notice.show_message(event.error, event.hint)

    def _on_controller_context_trimmed(self, num_messages: int) -> None:
        self.notice.show_message(
            f"This chat no longer fits the model's context: its oldest {num_messages} "
            "message(s) after the system prompt were left out of what the model saw.",
            is_error=False)

    def _on_notice_action_triggered(self, action: str) -> None:
        if action == RESTART:
            self._restart_engine()

    def _on_model_status_cancel_requested(self) -> None:
        self.worker.kill()
        self.endpoint_client.kill()
        self.controller.clear_model()
        self.model_status.show_unloaded("No model loaded (load cancelled)")

    def _on_chat_view_settings_requested(self) -> None:
        if self.controller.conversation is not None:
            self.open_conversation_settings(self.controller.conversation.id)

    def _on_settings_dialog_accepted(self, dialog: ConversationSettingsDialog) -> None:
        cid = dialog.conversation.id
        self.controller.update_settings(cid, dialog.settings())
        self.controller.rename_conversation(cid, dialog.title())

    def _on_ctrl_enter_action_toggled(self, on: bool) -> None:
        self.settings.set_sends_on_ctrl_enter(on)
        self.chat_view.set_sends_on_ctrl_enter(on)

    def _restart_engine(self) -> None:
        self.notice.hide()
        if self.last_remote is not None:
            self.load_remote(self.last_remote)
            return
        self.load(self.last_load or LoadRequest())

    # ------------------------------------------------------------------ closing

    def closeEvent(self, event) -> None:  # noqa: N802 (Qt override)
        """Hide at once, ask the worker to exit (killed after a timeout), then close for good."""
        self.model_download.cancel()  # what arrived is kept for the next start
        self.gguf_import.cancel()  # a half-done import is removed: the next one starts over
        self.endpoint_client.kill()  # an answer streaming from an endpoint is kept, interrupted
        if self.server_panel.keeps_serving:
            self.worker.release()  # serves on after the window, until stopped by a signal
        if self.worker.is_running:
            if not self._is_closing:
                self._is_closing = True
                self.settings.set_geometry(self.saveGeometry())
                self.hide()
                self.worker.shutdown()
            event.ignore()
            return
        if not self._is_closing:
            self.settings.set_geometry(self.saveGeometry())
        self.gpu_probe.close()
        event.accept()
        self.sig_closed.emit()
