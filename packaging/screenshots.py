"""Refresh the README's screenshots: the real app, its real worker and the bundled demo model,
in a virtual X display (Xvfb) when there is one, else Qt's offscreen platform. Saves
resources/screenshots/{chat,picker,performance}.png. Uses fresh data and settings folders and
an empty Hugging Face cache, so nothing of yours shows and every run looks alike.

    python packaging/screenshots.py [--out DIR] [--offscreen]
"""

from __future__ import annotations

import argparse
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
TOKENS_BEFORE_GRAB = 50  # the chat is grabbed mid-answer, at the first Stats after these
QUESTION = "What does os.path.join do?"
LONG_PROMPT = "Write a long story about the locale module"  # a long answer (seed 10, t=1.3)


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
    parser.add_argument("--out", type=Path, default=REPO_ROOT / "resources" / "screenshots")
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


class Shooter:
    """Drives the window through a short session and grabs it at the right moments."""

    def __init__(self, out: Path) -> None:
        from app.__main__ import create_application

        self.out = out
        self.qt_app = create_application()
        out.mkdir(parents=True, exist_ok=True)

    def run(self) -> int:
        from app.app_settings import AppSettings
        from app.conversation import ChatSettings
        from app.conversation_store import FILE_NAME, ConversationStore
        from app.main_window import MainWindow
        from app.paths import data_dir
        from app.worker_client import WorkerClient
        from engine.events import LoadRequest

        store = ConversationStore(data_dir() / FILE_NAME)
        worker = WorkerClient()
        window = self.window = MainWindow(store, worker, AppSettings())
        window.resize(*WINDOW_SIZE)
        window.show()
        self.wait(worker.sig_loaded, lambda: window.start(LoadRequest()), 60)
        controller = window.controller
        for question in ("What does locale.getlocale do?", "And os.getcwd?", QUESTION):
            self.ask(question)  # answers for the performance panel's charts
            self.pause(0.6)
        window.conversation_list.new_button.click()
        controller.update_settings(controller.conversation.id,
                                   ChatSettings(max_new_tokens=400, temperature=1.3, seed=10))
        count, grabbed = [0], []

        def on_token(_event) -> None:
            count[0] += 1

        def on_stats(_event) -> None:  # after the chat's own handler: the counter is current
            if count[0] >= TOKENS_BEFORE_GRAB and not grabbed:  # in the slot: mid-answer now
                grabbed.append(True)
                for view in window.chat_view.message_views.values():
                    view.render()
                window.chat_view.scroll_area.verticalScrollBar().setValue(10**6)
                window.chat_view.layout().activate()  # the counter's new width, no event loop
                self.save(window, "chat")

        worker.sig_token.connect(on_token)
        worker.sig_stats.connect(on_stats)
        self.ask(LONG_PROMPT)
        worker.sig_token.disconnect(on_token)
        worker.sig_stats.disconnect(on_stats)
        if not grabbed:
            raise RuntimeError(f"the answer ended after {count[0]} tokens, before the grab")
        self.pause(0.3)
        window.performance_panel.redraw()
        self.save(window.performance_dock, "performance")

        window.open_model_picker()
        picker = window.picker
        picker.model_list.setCurrentRow(0)
        picker.fit_panel.speculation_combo.setCurrentIndex(2)  # the bundled draft model
        picker.get_model_panel.repo_edit.setText("Qwen/Qwen2.5-7B-Instruct")
        self.pause(0.3)
        self.save(picker, "picker")
        picker.reject()
        self.wait(window.sig_closed, window.close, 10)
        worker.kill()
        store.close()
        return 0

    def ask(self, text: str) -> None:
        chat = self.window.chat_view
        chat.input.setPlainText(text)
        self.wait(self.window.worker.sig_finished, chat.send_button.click, 60)

    def save(self, widget, name: str) -> None:
        path = self.out / f"{name}.png"
        widget.grab().save(str(path), "PNG")
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
