"""Refresh the README's screenshots: the real app, its real worker and the bundled demo model,
in a virtual X display (Xvfb) when there is one, else Qt's offscreen platform. Saves, in the
light theme and (-dark) the dark one, into docs/screenshots/: welcome (an empty conversation),
chat (code, and an answer with an alternative), picker (Hub search results from a fake Hub on
localhost, tests/app/fake_hub.py) and performance (the panel on the CPU). Uses fresh data and
settings folders and an empty Hugging Face cache, so nothing of yours shows and every run looks
alike.

    python packaging/screenshots.py [--out DIR] [--offscreen]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
MAX_PNG_BYTES = 150_000
WINDOW_SIZE = (1180, 720)
DISPLAY = ":87"
QUESTION = "What does os.path.join do?"
CODE_ANSWER = """Open it with `with`, which closes the file for you, and loop over it:

```python
from pathlib import Path

def read_lines(path: str) -> list[str]:
    lines = []
    with open(path, encoding="utf-8") as f:
        for line in f:  # one line at a time, never the whole file
            lines.append(line.rstrip("\\n"))
    return lines

print(len(read_lines("notes.txt")))  # 42
```

For a small file, `Path("notes.txt").read_text().splitlines()` does it in one call."""
QWEN_05B = {"architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "hidden_size": 896,
            "num_hidden_layers": 24, "num_attention_heads": 14, "num_key_value_heads": 2,
            "intermediate_size": 4864, "vocab_size": 151936, "max_position_embeddings": 32768,
            "tie_word_embeddings": True, "torch_dtype": "bfloat16", "use_sliding_window": False}
SEARCH_REPOS = {  # what the fake Hub serves: a config.json and a weights file per repo
    repo: {"config.json": json.dumps(QWEN_05B).encode(),
           "model.safetensors": b"\0" * 64}
    for repo in ("Qwen/Qwen2.5-0.5B-Instruct", "Qwen/Qwen2.5-1.5B-Instruct",
                 "Qwen/Qwen2.5-7B-Instruct", "Qwen/Qwen2.5-Coder-1.5B-Instruct")}
SEARCH_ANSWER = [  # as the Hub answers /api/models?search=qwen instruct (figures illustrative)
    {"id": "Qwen/Qwen2.5-7B-Instruct", "downloads": 1_843_000,
     "safetensors": {"parameters": {"BF16": 7_615_616_512}}},
    {"id": "Qwen/Qwen2.5-0.5B-Instruct", "downloads": 1_377_000,
     "safetensors": {"parameters": {"BF16": 494_032_768}}},
    {"id": "Qwen/Qwen2.5-1.5B-Instruct", "downloads": 902_000,
     "safetensors": {"parameters": {"BF16": 1_543_714_304}}},
    {"id": "Qwen/Qwen2.5-Coder-1.5B-Instruct", "downloads": 211_000,
     "safetensors": {"parameters": {"BF16": 1_543_714_304}}},
]


def start_display(offscreen: bool) -> subprocess.Popen | None:
    """Xvfb on DISPLAY unless offscreen is asked for or Xvfb is missing."""
    if offscreen or shutil.which("Xvfb") is None:
        os.environ["QT_QPA_PLATFORM"] = "offscreen"
        return None
    xvfb = subprocess.Popen(["Xvfb", DISPLAY, "-screen", "0", "1600x1000x24", "-nolisten",
                             "tcp"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    time.sleep(0.5)
    os.environ.update(DISPLAY=DISPLAY, QT_QPA_PLATFORM="xcb")
    return xvfb


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=REPO_ROOT / "docs" / "screenshots")
    parser.add_argument("--offscreen", action="store_true", help="Qt's offscreen platform")
    args = parser.parse_args()
    scratch = Path(tempfile.mkdtemp(prefix="hearth-screenshots-"))
    os.environ.update(HEARTH_DATA_DIR=str(scratch / "data"), XDG_CONFIG_HOME=str(scratch / "cfg"),
                      HF_HUB_CACHE=str(scratch / "hub"))
    xvfb = start_display(args.offscreen)
    sys.path.insert(0, str(REPO_ROOT))
    try:
        return Shooter(args.out).run()
    finally:
        if xvfb is not None:
            xvfb.terminate()
        shutil.rmtree(scratch, ignore_errors=True)


def shrink(path: Path) -> None:
    """256 colours, no dithering: a third of the bytes and no visible change for a UI (flat
    colours, anti-aliased text). With Pillow where it is installed; else the PNG stays as is."""
    try:
        from PIL import Image
    except ImportError:
        print("  (install Pillow to make the PNGs about three times smaller)", file=sys.stderr)
        return
    with Image.open(path) as image:
        quantized = image.convert("RGB").quantize(256, method=Image.Quantize.MEDIANCUT,
                                                  dither=Image.Dither.NONE)
    quantized.save(path, optimize=True)


class Shooter:
    """Drives the window through a short session and grabs it at the right moments."""

    def __init__(self, out: Path) -> None:
        from app.__main__ import create_application

        self.out = out
        self.qt_app = create_application()
        out.mkdir(parents=True, exist_ok=True)

    def run(self) -> int:
        from app.app_settings import AppSettings
        from app.history.conversation_store import FILE_NAME, ConversationStore
        from app.main_window import MainWindow
        from app.paths import data_dir
        from app.worker.worker_client import WorkerClient
        from engine.events import LoadRequest

        store = ConversationStore(data_dir() / FILE_NAME)
        worker = WorkerClient()
        window = self.window = MainWindow(store, worker, AppSettings())
        window.resize(*WINDOW_SIZE)
        window.show()
        self.wait(worker.sig_loaded, lambda: window.start(LoadRequest()), 60)
        window.notice.hide()  # the demo-model banner: the welcome screen says the same
        self.both_themes(window, "welcome")
        for question in ("What does locale.getlocale do?", "And os.getcwd?", QUESTION):
            self.ask(question)  # answers for the performance panel's charts
            self.pause(0.6)
        self.pause(1.5)  # a few samples of the worker's memory and CPU
        window.performance_panel.redraw()
        self.both_themes(window.performance_dock, "performance")

        self.chat_with_code_and_alternatives(window, store)
        self.both_themes(window, "chat")
        self.picker_with_search_results(window)
        self.wait(window.sig_closed, window.close, 10)
        worker.kill()
        store.close()
        return 0

    def chat_with_code_and_alternatives(self, window, store) -> None:
        """A conversation with a code answer (imported, as a user would bring one), answered
        again by the demo model, and the first answer shown again: `< 1/2 >`."""
        from app.history.conversation import ChatSettings

        path = Path(tempfile.mkdtemp()) / "chat.json"
        path.write_text(json.dumps({"title": "Reading a file in Python", "messages": [
            {"role": "user", "content": "How do I read a text file line by line in Python?"},
            {"role": "assistant", "content": CODE_ANSWER}]}))
        conversation = window.conversation_list.import_file(path)
        window.conversation_list.message_label.hide()
        window.controller.update_settings(conversation.id, ChatSettings(temperature=0.8,
                                                                         max_new_tokens=60))
        self.wait(window.worker.sig_finished, window.chat_view.regenerate_button.click, 60)
        answer = store.messages(conversation.id)[-1]
        window.chat_view.message_views[answer.id].previous_button.click()
        self.pause(0.3)

    def picker_with_search_results(self, window) -> None:
        import huggingface_hub.constants

        from tests.app.fake_hub import FakeHub, Lie

        with FakeHub(SEARCH_REPOS) as hub:
            os.environ["HF_ENDPOINT"] = hub.url  # read at each call (hub_listing.endpoint)
            huggingface_hub.constants.HF_HUB_OFFLINE = False
            hub.search_answer = json.dumps(SEARCH_ANSWER).encode()
            hub.lies["model.safetensors"] = Lie(size=988_097_824)
            window.open_model_picker()
            picker = window.picker
            picker.resize(1100, 760)
            panel = picker.get_model_panel
            panel.repo_edit.setText("qwen instruct")
            self.wait(picker.download.sig_found, panel.check_button.click, 30)
            item = panel.results.item(1)  # the 0.5B: the fake Hub's configs are its shape
            panel.results.setCurrentItem(item)
            self.wait(picker.download.sig_listed, lambda: panel.results.itemClicked.emit(item),
                      30)
            self.pause(0.3)
            self.both_themes(picker, "picker")
            picker.reject()

    def both_themes(self, widget, name: str) -> None:
        for mode, suffix in (("light", ""), ("dark", "-dark")):
            self.window.set_theme(mode)
            self.pause(0.3)
            self.save(widget, name + suffix)
        self.window.set_theme("light")

    def ask(self, text: str) -> None:
        chat = self.window.chat_view
        chat.input.setPlainText(text)
        self.wait(self.window.worker.sig_finished, chat.send_button.click, 60)

    def save(self, widget, name: str) -> None:
        path = self.out / f"{name}.png"
        widget.grab().save(str(path), "PNG")
        shrink(path)
        size = path.stat().st_size
        print(f"{path} {widget.width()}x{widget.height()} {size / 1000:.0f} kB")
        if size > MAX_PNG_BYTES:
            print(f"  larger than {MAX_PNG_BYTES / 1000:.0f} kB: make the window smaller",
                  file=sys.stderr)

    def wait(self, signal, action, timeout_s: float) -> None:
        """Do `action` and run the event loop until `signal` fires."""
        from PySide6.QtCore import QEventLoop, QTimer

        loop, fired = QEventLoop(), []

        def on_signal(*_args) -> None:
            fired.append(True)
            loop.quit()

        signal.connect(on_signal)
        QTimer.singleShot(int(timeout_s * 1000), loop.quit)
        action()
        if not fired:
            loop.exec()
        signal.disconnect(on_signal)
        if not fired:
            raise TimeoutError(f"nothing happened within {timeout_s:.0f} s")

    def pause(self, seconds: float) -> None:
        from PySide6.QtCore import QEventLoop, QTimer

        loop = QEventLoop()
        QTimer.singleShot(int(seconds * 1000), loop.quit)
        loop.exec()


if __name__ == "__main__":
    sys.exit(main())
