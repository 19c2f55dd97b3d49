"""`python -m app`: open the Hearth window and load a model (--model, else the starter model
once imported, else the bundled demo model). `hearth` / `hearth gui` start this as a new
process."""

# ruff: noqa: E402 (the start-up clock is read before the imports, which are most of the start)
from __future__ import annotations

import time

STARTED_AT = time.perf_counter()

import argparse
import logging
import os
import shlex
import sys

from PySide6.QtGui import QIcon
from PySide6.QtWidgets import QApplication

from app.app_settings import AppSettings
from app.gui_thread_gc import GuiThreadGC
from app.history.store_opening import open_store
from app.log_file import setup_logging
from app.main_window import MainWindow
from app.paths import RESOURCES_DIR, data_dir
from app.startup_timer import StartupTimer
from app.worker import worker_client
from app.worker.worker_client import WorkerClient
from engine.events import LoadRequest, kv_dtype_choices, quant_choices
from engine.files import model_home
from engine.platform import display

log = logging.getLogger("hearth")
ICON = "icons/hearth.svg"  # in RESOURCES_DIR, package data


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="hearth gui", description="Open the Hearth window.")
    parser.add_argument("--model", help="a model folder, a name in Hearth's models folder or a "
                                        "cached Hugging Face repo id (default: the starter model "
                                        "if imported, else the bundled demo model)")
    parser.add_argument("--quant", default="auto", choices=quant_choices())
    parser.add_argument("--kv-dtype", default="auto", choices=kv_dtype_choices())
    parser.add_argument("--context", type=int, help="tokens of context (default: the planner's)")
    parser.add_argument("--worker-command",
                        help="the engine process to start (default: python -m engine.cli.worker)")
    parser.add_argument("--startup-check", action="store_true",
                        help="print the seconds until the window appeared and whether the "
                             "style sheet and icon loaded, then quit")
    return parser.parse_args(argv)


def create_application() -> QApplication:
    """The QApplication with Hearth's names (QSettings' location), icon and style sheet."""
    QApplication.setApplicationName("Hearth")
    QApplication.setOrganizationName("Hearth")
    qt_app = QApplication(sys.argv[:1])
    qt_app.setQuitOnLastWindowClosed(False)  # the window quits once its worker has ended
    qt_app.setWindowIcon(QIcon(str(RESOURCES_DIR / ICON)))
    style = RESOURCES_DIR / "hearth.qss"
    if style.is_file():
        qt_app.setStyleSheet(style.read_text(encoding="utf-8"))
    return qt_app


def open_window(args: argparse.Namespace, settings: AppSettings | None = None) -> MainWindow:
    """The start before the window shows: the data folder, the log, the conversations (a
    damaged or unwritable database, or an unreadable models folder, gets a notice in the
    window, not a traceback), the worker."""
    folder = data_dir()
    log_path = setup_logging(folder)
    log.info("starting; data in %s, log in %s", folder, log_path or "none (stderr only)")
    opened = open_store(folder)
    # what the user must know of Hearth's folders: said in the window, the start goes on
    notice = " ".join(n for n in (opened.notice, model_home.models_dir_problem()) if n)
    if notice:
        log.warning("%s", notice)
    command = shlex.split(args.worker_command) if args.worker_command else None
    window = MainWindow(opened.store, WorkerClient(command), settings or AppSettings())
    if notice:
        window.show_storage_notice(notice)
    return window


def load_request(args: argparse.Namespace) -> LoadRequest:
    return LoadRequest(model=args.model or model_home.default_model(), quant=args.quant,
                       kv_dtype=args.kv_dtype, context=args.context)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if not display.has_display():  # Qt would abort with its own message
        print(f"hearth: {display.NO_DISPLAY}", file=sys.stderr)
        return 2
    qt_app = create_application()
    collector = GuiThreadGC(qt_app)  # Qt objects are destroyed on the GUI thread only
    window = open_window(args)
    worker, store = window.worker, window.store
    window.sig_closed.connect(qt_app.quit)
    timer = StartupTimer(window, STARTED_AT)
    timer.sig_shown.connect(lambda s: log.info("window shown %.3f s after start", s))
    if args.startup_check:
        timer.sig_shown.connect(lambda s: _report_and_quit(s, worker, qt_app))
    window.show()
    window.start(load_request(args))
    code = qt_app.exec()
    collector.stop()
    worker.kill()  # normally gone already: closing the window shut it down
    store.close()
    if worker_client.RELEASED:  # a worker serving on past the window: Qt's teardown of its
        logging.shutdown()  # QProcess would kill it, so the app leaves without one
        sys.stdout.flush()
        os._exit(code)
    return code


def _report_and_quit(seconds: float, worker: WorkerClient, qt_app: QApplication) -> None:
    print(f"window shown after {seconds:.3f} s", flush=True)
    # what an installed wheel must carry: a window without them opens unstyled and iconless
    style = qt_app.styleSheet()
    print(f"style sheet: {f'loaded, {len(style)} characters' if style else 'MISSING'}")
    icon = not qt_app.windowIcon().pixmap(32, 32).isNull()
    print(f"icon: {'loaded' if icon else 'MISSING'} ({RESOURCES_DIR / ICON})", flush=True)
    worker.kill()
    qt_app.quit()


if __name__ == "__main__":
    sys.exit(main())
