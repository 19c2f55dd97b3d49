"""The Server panel: start and stop the OpenAI-compatible server inside the worker, on the model
the window has loaded; its address, key and live figures (from `server_stats`, once a second).
While it serves nothing itself, it watches its address: a Hearth server started elsewhere (`hearth
serve` in a terminal) that answers there is shown with its own live figures (server_watch.py).
"""

from __future__ import annotations

import secrets

from PySide6.QtCore import Qt
from PySide6.QtGui import QGuiApplication
from PySide6.QtWidgets import (
    QCheckBox,
    QFormLayout,
    QHBoxLayout,
    QLabel,
    QLineEdit,
    QPushButton,
    QSpinBox,
    QVBoxLayout,
    QWidget,
)

from app.app_settings import AppSettings
from app.remote.endpoint_keys import EndpointKeys
from app.server.server_watch import ServerWatch
from app.worker.worker_client import WorkerClient
from engine.events import Failed, ServeRequest, ServerStats, ServerStopped, ServeStopRequest
from engine.events.server_routes import SERVER_ROUTES
from engine.remote.server_figures import ServerFigures

NEEDS_MODEL = "Load a model first: the server answers with the window's model."
READY = "Ready: Start server serves the window's model at this address."


# the local server's key, in the system keyring like the endpoints' keys (never in the settings);
# one per process, so a key kept in memory where no keyring works outlives a panel
KEYS = EndpointKeys(service="Hearth local server")
KEY_NAME = "api_key"


class ServerPanel(QWidget):
    def __init__(self, worker: WorkerClient, settings: AppSettings, parent=None) -> None:
        super().__init__(parent)
        self.worker, self.settings = worker, settings
        self.has_model = False
        self.is_wanted = False  # started by the user and not stopped: comes back after a restart
        self.is_starting = False
        self.external: ServerFigures | None = None  # a Hearth server of another process, here
        saved = settings.server()
        self.host_edit = QLineEdit(saved["host"])
        self.port_spin = QSpinBox()
        self.port_spin.setRange(1, 65535)
        self.port_spin.setValue(saved["port"])
        self.key_edit = QLineEdit(KEYS.get(KEY_NAME) or "")
        self.key_edit.setPlaceholderText("none (this machine only)")
        self.key_edit.setEchoMode(QLineEdit.EchoMode.PasswordEchoOnEdit)
        generate = QPushButton("Generate")
        generate.clicked.connect(self._on_generate_clicked)
        self.copy_key_button = QPushButton("Copy")
        self.copy_key_button.clicked.connect(lambda: self._copy(self.key_edit.text()))
        key_row = QHBoxLayout()
        for w in (self.key_edit, generate, self.copy_key_button):
            key_row.addWidget(w)
        self.keep_check = QCheckBox("Keep serving after Hearth closes")
        self.keep_check.setChecked(saved["keep"])
        self.start_button = QPushButton("Start server")
        self.start_button.clicked.connect(self._on_start_button_clicked)
        self.url_label = QLabel("")
        self.url_label.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        self.copy_url_button = QPushButton("Copy URL")
        self.copy_url_button.clicked.connect(lambda: self._copy(self.url_label.text()))
        url_row = QHBoxLayout()
        url_row.addWidget(self.url_label, 1)
        url_row.addWidget(self.copy_url_button)
        # what the server answers under its address, by protocol, for pointing a client at it
        self.routes_label = QLabel("\n".join(f"{protocol}: {' · '.join(paths)}"
                                              for protocol, paths in SERVER_ROUTES))
        self.routes_label.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        self.routes_label.setWordWrap(True)
        self.stats_label = QLabel("")
        self.status_label = QLabel(NEEDS_MODEL)
        self.status_label.setWordWrap(True)
        form = QFormLayout()
        form.addRow("Host", self.host_edit)
        form.addRow("Port", self.port_spin)
        form.addRow("API key", key_row)
        layout = QVBoxLayout(self)
        layout.addLayout(form)
        layout.addWidget(self.keep_check)
        layout.addWidget(self.start_button)
        layout.addLayout(url_row)
        layout.addWidget(self.routes_label)
        layout.addWidget(self.stats_label)
        layout.addWidget(self.status_label)
        layout.addStretch(1)
        worker.sig_serving.connect(self._on_worker_serving)
        worker.sig_server_stats.connect(self._on_worker_server_stats)
        worker.sig_server_stopped.connect(self._on_worker_server_stopped)
        worker.sig_server_failed.connect(self._on_worker_server_failed)
        self.watch = ServerWatch(self)
        self.watch.sig_figures.connect(self._on_watch_figures)
        self.watch.sig_gone.connect(self._on_watch_gone)
        for edit in (self.host_edit, self.key_edit):
            edit.editingFinished.connect(self._watch_address)
        self.port_spin.valueChanged.connect(self._watch_address)
        self._show_state()

    # ------------------------------------------------------------------ public

    @property
    def is_serving(self) -> bool:
        return bool(self.worker.server_url)

    @property
    def keeps_serving(self) -> bool:
        """Serving and asked to outlive the window: closing lets the worker go, not ends it."""
        return self.is_serving and self.keep_check.isChecked()

    def set_has_model(self, has_model: bool) -> None:
        """A model is loaded (Loaded) or none is (a load started, the worker ended). A server
        the user started and did not stop comes back once a model is loaded again."""
        self.has_model = has_model
        if has_model and self.is_wanted and not self.is_serving and not self.is_starting:
            self.start()
        self._show_state()

    def start(self) -> None:
        key = self.key_edit.text().strip() or None
        request = ServeRequest(host=self.host_edit.text().strip(), port=self.port_spin.value(),
                               api_key=key, keep=self.keep_check.isChecked())
        KEYS.set(KEY_NAME, key)
        self.settings.set_server({"host": request.host, "port": request.port,
                                  "keep": request.keep})
        self.is_wanted = self.is_starting = True
        self.watch.stop()
        self.status_label.setText("Starting…")
        self.worker.send(request)
        self._show_state()

    def stop(self) -> None:
        self.is_wanted = False
        if self.is_serving:
            self.worker.send(ServeStopRequest())
            self.status_label.setText("Stopping…")

    def showEvent(self, event) -> None:  # noqa: N802 (Qt's name)
        super().showEvent(event)
        self._watch_address()  # only while the panel is seen: no polling of a hidden tab

    def hideEvent(self, event) -> None:  # noqa: N802
        super().hideEvent(event)
        self.watch.pause()

    # ------------------------------------------------------------------ slots

    def _on_start_button_clicked(self) -> None:
        if self.is_serving or self.is_starting:
            self.stop()
        else:
            self.start()

    def _on_generate_clicked(self) -> None:
        self.key_edit.setText("sk-hearth-" + secrets.token_urlsafe(24))

    def _on_worker_serving(self, event) -> None:
        self.is_starting = False
        self.url_label.setText(event.url)
        self.status_label.setText("Serving the window's model; its clients and the chat run "
                                  "in one batch.")
        self._show_state()

    def _on_worker_server_stats(self, event: ServerStats) -> None:
        self.stats_label.setText(
            f"{event.num_clients} client(s) connected · {event.num_running} running, "
            f"{event.num_waiting} waiting · {event.tokens_per_s:.1f} tokens/s")

    def _on_worker_server_stopped(self, event: ServerStopped) -> None:
        self.is_starting = False
        self.stats_label.setText("")
        self.status_label.setText(f"Stopped: {event.error}." if event.error else "Stopped.")
        self._show_state()
        self._watch_address()

    def _on_worker_server_failed(self, event: Failed) -> None:
        self.is_starting = self.is_wanted = False
        self.status_label.setText(f"Could not start the server: {event.error}"
                                  + (f" ({event.hint})" if event.hint else ""))
        self._show_state()
        self._watch_address()

    def _on_watch_figures(self, figures: ServerFigures, tokens_per_s: float) -> None:
        if self.is_serving or self.is_starting:
            return
        self.external = figures
        self.url_label.setText(self._address() + "/v1")
        self.status_label.setText(
            f"A Hearth server started outside this window answers here, with {figures.model}; "
            "stop it where it runs, or choose another port to start one on this window's model.")
        if figures.metrics_refused:
            self.stats_label.setText("Its figures need its API key: enter it above.")
        else:
            self.stats_label.setText(
                f"{figures.clients} client(s) connected · {figures.running} running, "
                f"{figures.waiting} waiting · {tokens_per_s:.1f} tokens/s · "
                f"{figures.tokens:,} tokens generated")
        self._show_state()

    def _on_watch_gone(self) -> None:
        if self.external is None:
            return
        self.external = None
        self.stats_label.setText("")
        self.status_label.setText("The server that answered here has stopped.")
        self._show_state()

    # ------------------------------------------------------------------ helpers

    def _show_state(self) -> None:
        serving, busy = self.is_serving, self.is_serving or self.is_starting
        elsewhere = self.external is not None and not busy
        self.start_button.setText("Stop server" if busy else "Start server")
        self.start_button.setEnabled(busy or (self.has_model and not elsewhere))
        for w in (self.host_edit, self.port_spin, self.key_edit, self.keep_check):
            w.setEnabled(not busy)
        self.copy_url_button.setEnabled(serving or elsewhere)
        if not (serving or elsewhere):
            self.url_label.setText("")
        if not (busy or elsewhere or self.has_model or self.is_wanted):
            self.status_label.setText(NEEDS_MODEL)
        elif self.has_model and self.status_label.text() == NEEDS_MODEL:
            self.status_label.setText(READY)  # the model the words asked for has come

    def _address(self) -> str:
        host = self.host_edit.text().strip() or "127.0.0.1"
        return f"http://{f'[{host}]' if ':' in host else host}:{self.port_spin.value()}"

    def _watch_address(self) -> None:
        """Watch the address set above while this window serves nothing there itself and the
        panel is in sight."""
        if self.is_serving or self.is_starting or not self.isVisible():
            return
        url = self._address()
        if self.external is not None and url != self.watch.url:  # what answered is not here
            self.external = None
            self.stats_label.setText("")
            self._show_state()
        self.watch.watch(url, self.key_edit.text().strip() or None)

    def _copy(self, text: str) -> None:
        if text:
            QGuiApplication.clipboard().setText(text)
