"""The Server panel against a real `hearth serve` subprocess on the bundled demo model: set to its
address, the panel shows it as a server of another process (its model, URL, live clients and
tokens from its /metrics, read with the key), will not start a second one on that port, and goes
back to its own state once the subprocess ends."""

from __future__ import annotations

import json
import threading
import urllib.request

import pytest

from app.paths import DEMO_MODEL_DIR
from app.server.server_panel import ServerPanel
from app.worker.worker_client import WorkerClient
from tests.engine.helpers import hearth_serve

pytest.importorskip("torch")  # the engine's side; the app itself never imports it
pytest.importorskip("fastapi")
if not (DEMO_MODEL_DIR / "model.safetensors").is_file():
    pytest.skip("the bundled demo model is missing", allow_module_level=True)

KEY = "sk-test-external-0123456789"


def _stream(url: str, max_tokens: int) -> list[bytes]:
    body = {"model": "x", "messages": [{"role": "user", "content": "Tell me a story"}],
            "max_tokens": max_tokens, "ignore_eos": True, "temperature": 0, "stream": True,
            "stream_options": {"include_usage": True}}
    models = urllib.request.Request(url + "/models", headers={"Authorization": f"Bearer {KEY}"})
    with urllib.request.urlopen(models, timeout=30) as r:
        body["model"] = json.loads(r.read())["data"][0]["id"]
    request = urllib.request.Request(url + "/chat/completions", json.dumps(body).encode(),
                                     {"Content-Type": "application/json",
                                      "Authorization": f"Bearer {KEY}"})
    with urllib.request.urlopen(request, timeout=120) as r:
        return [line for line in r if line.startswith(b"data: ")]


def test_the_panel_shows_a_hearth_serve_of_another_process(qtbot, settings):
    proc, url = hearth_serve("--api-key", KEY)
    worker = WorkerClient()  # never started: the panel's own server is not what this checks
    try:
        port = int(url.rsplit(":", 1)[1].removesuffix("/v1"))
        panel = ServerPanel(worker, settings)
        qtbot.addWidget(panel)
        panel.set_has_model(True)  # as if the window had a model: the port is still taken
        panel.key_edit.setText("")
        panel.port_spin.setValue(port)
        qtbot.wait(1500)
        assert panel.external is None  # a panel out of sight asks nothing
        panel.show()
        qtbot.waitUntil(lambda: panel.external is not None, timeout=10_000)
        assert panel.url_label.text() == url and panel.copy_url_button.isEnabled()
        assert "outside this window" in panel.status_label.text()
        assert panel.external.model in panel.status_label.text()
        assert not panel.start_button.isEnabled()  # a second server cannot bind there
        assert "API key" in panel.stats_label.text()  # its /metrics refused us without the key
        panel.key_edit.setText(KEY)
        panel.key_edit.editingFinished.emit()
        qtbot.waitUntil(lambda: "tokens generated" in panel.stats_label.text(), timeout=10_000)
        assert panel.stats_label.text().startswith("0 client(s) connected · 0 running")
        streamed = {}
        client = threading.Thread(target=lambda: streamed.setdefault("lines", _stream(url, 900)))
        client.start()
        qtbot.waitUntil(lambda: panel.stats_label.text().startswith("1 client(s) connected · 1 "
                                                                    "running"), timeout=20_000)
        client.join(120)
        usage = json.loads(streamed["lines"][-2][6:])["usage"]  # the line before [DONE]
        assert usage["completion_tokens"] > 0
        qtbot.waitUntil(lambda: f"{usage['completion_tokens']:,} tokens generated"
                        in panel.stats_label.text(), timeout=10_000)
        assert panel.stats_label.text().startswith("0 client(s) connected · 0 running")
        proc.terminate()
        assert proc.wait(30) == 0
        qtbot.waitUntil(lambda: panel.external is None, timeout=10_000)
        assert panel.url_label.text() == "" and panel.start_button.isEnabled()
        assert "has stopped" in panel.status_label.text()
    finally:
        proc.kill()
        proc.wait()
        worker.kill()
