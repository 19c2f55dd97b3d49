"""The Server panel against the real worker on the bundled demo model: disabled without a
model, starts the server inside the worker, which answers plain HTTP (/v1/models, a chat
completion) with the window's model and its key; a port in use is one clear line; stop works;
the settings are remembered."""

from __future__ import annotations

import json
import socket
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from app.paths import DEMO_MODEL_DIR
from app.server.server_panel import NEEDS_MODEL, ServerPanel
from app.worker.worker_client import WorkerClient
from engine.events import LoadRequest

pytest.importorskip("torch")  # the engine's side; the app itself never imports it
pytest.importorskip("fastapi")
if not (DEMO_MODEL_DIR / "model.safetensors").is_file():
    pytest.skip("the bundled demo model is missing", allow_module_level=True)

TIMEOUT_MS = 60_000


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _call(url: str, key: str | None = None, body: dict | None = None,
          key_header: str = "Authorization") -> dict:
    headers = {"Content-Type": "application/json"}
    if key:
        headers[key_header] = f"Bearer {key}" if key_header == "Authorization" else key
    data = json.dumps(body).encode() if body is not None else None
    with urllib.request.urlopen(urllib.request.Request(url, data, headers), timeout=60) as r:
        return json.loads(r.read())


def test_the_panel_serves_the_window_model_and_stops(qtbot, settings):
    worker = WorkerClient()  # python -m engine.cli.worker
    panel = ServerPanel(worker, settings)
    qtbot.addWidget(panel)
    try:
        assert not panel.start_button.isEnabled() and panel.status_label.text() == NEEDS_MODEL
        with qtbot.waitSignal(worker.sig_loaded, timeout=TIMEOUT_MS):
            worker.send(LoadRequest(device="cpu", context=256))
        panel.set_has_model(True)
        assert panel.start_button.isEnabled()
        port = _free_port()
        panel.port_spin.setValue(port)
        panel._on_generate_clicked()
        key = panel.key_edit.text()
        assert key.startswith("sk-hearth-") and len(key) > 30
        with qtbot.waitSignal(worker.sig_serving, timeout=TIMEOUT_MS):
            panel.start_button.click()
        url = f"http://127.0.0.1:{port}/v1"
        assert panel.url_label.text() == url and panel.start_button.text() == "Stop server"
        assert not panel.port_spin.isEnabled()
        with pytest.raises(urllib.error.HTTPError) as refused:
            _call(url + "/models")
        assert refused.value.code == 401
        name = _call(url + "/models", key)["data"][0]["id"]
        answer = _call(url + "/chat/completions", key, {
            "model": name, "messages": [{"role": "user", "content": "Hello"}],
            "max_tokens": 4, "temperature": 0})
        assert answer["choices"][0]["message"]["role"] == "assistant"
        # every protocol it speaks is listed, and answers: Anthropic's with its own key header
        assert "/v1/messages" in panel.routes_label.text()
        assert "/v1/responses" in panel.routes_label.text()
        message = _call(url + "/messages", key, {
            "model": name, "messages": [{"role": "user", "content": "Hello"}],
            "max_tokens": 4, "temperature": 0}, key_header="x-api-key")
        assert message["type"] == "message" and message["content"][0]["type"] == "text"
        with qtbot.waitSignal(worker.sig_server_stats, timeout=5_000):
            pass
        assert "tokens/s" in panel.stats_label.text()
        with qtbot.waitSignal(worker.sig_server_stopped, timeout=TIMEOUT_MS):
            panel.start_button.click()
        assert panel.start_button.text() == "Start server" and panel.url_label.text() == ""
        with pytest.raises(OSError):
            _call(url + "/models", key)
        with socket.socket() as taken:  # someone else's port: one line, and the panel says so
            taken.bind(("127.0.0.1", 0))
            taken.listen()
            panel.port_spin.setValue(taken.getsockname()[1])
            with qtbot.waitSignal(worker.sig_server_failed, timeout=TIMEOUT_MS) as blocker:
                panel.start_button.click()
        assert "in use" in blocker.args[0].error and "\n" not in blocker.args[0].error
        assert "in use" in panel.status_label.text() and panel.port_spin.isEnabled()
        again = ServerPanel(worker, settings)  # what the next start of the app shows
        qtbot.addWidget(again)
        assert again.key_edit.text() == key and again.host_edit.text() == "127.0.0.1"
        assert again.port_spin.value() == panel.port_spin.value()
        settings.q.sync()  # the key is the keyring's (or this session's), never the settings'
        assert key not in Path(settings.q.fileName()).read_text()
    finally:
        worker.kill()


def test_a_kept_server_serves_on_after_the_window_lets_go(qtbot, settings):
    """"Keep serving after Hearth closes": the window releases its worker (what closeEvent does
    when the panel keeps serving) and the server answers on, until the process is told to end
    (SIGTERM); without the box, closing stops it (the panel's keeps_serving is False)."""
    from app.worker.worker_client import RELEASED

    worker = WorkerClient()
    panel = ServerPanel(worker, settings)
    qtbot.addWidget(panel)
    try:
        with qtbot.waitSignal(worker.sig_loaded, timeout=TIMEOUT_MS):
            worker.send(LoadRequest(device="cpu", context=256))
        panel.set_has_model(True)
        port = _free_port()
        panel.port_spin.setValue(port)
        panel.key_edit.setText("")  # no key: the default host needs none
        panel.keep_check.setChecked(False)
        assert not panel.keeps_serving  # not serving yet, and not asked to keep
        panel.keep_check.setChecked(True)
        with qtbot.waitSignal(worker.sig_serving, timeout=TIMEOUT_MS):
            panel.start_button.click()
        assert panel.keeps_serving
        worker.release()
        process = RELEASED[-1]
        url = f"http://127.0.0.1:{port}/v1"
        qtbot.wait(500)  # its stdin closed: a worker that stopped would be gone by now
        assert _call(url + "/models")["data"]  # the window's hold is gone; the server is not
        process.terminate()  # SIGTERM: what ends a kept server
        assert process.waitForFinished(30_000)
        with pytest.raises(OSError):
            _call(url + "/models")
    finally:
        worker.kill()
