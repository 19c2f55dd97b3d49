"""The main window's menus and its docks (performance, server): built here, behaviour in the
window's slots and the panels themselves."""

from __future__ import annotations

from PySide6.QtCore import Qt, QUrl
from PySide6.QtGui import QAction, QActionGroup, QDesktopServices, QKeySequence
from PySide6.QtWidgets import QDockWidget

from app.paths import data_dir
from app.widgets.theme import MODES

RESTART = "Restart engine"
PERFORMANCE_WIDTH = 400


def build_docks(window) -> None:
    """The performance charts and the Server panel, tabbed in one column on the right."""
    window.performance_dock = QDockWidget("Performance")
    window.performance_dock.setObjectName("performanceDock")
    window.performance_dock.setWidget(window.performance_panel)
    window.addDockWidget(Qt.DockWidgetArea.RightDockWidgetArea, window.performance_dock)
    window.server_dock = QDockWidget("Server")
    window.server_dock.setObjectName("serverDock")
    window.server_dock.setWidget(window.server_panel)
    window.tabifyDockWidget(window.performance_dock, window.server_dock)
    window.performance_dock.raise_()
    # the chat is the main thing: the charts get a column, the sidebar room for titles
    window.resizeDocks([window.performance_dock], [PERFORMANCE_WIDTH], Qt.Orientation.Horizontal)


def build_menus(window) -> None:
    chat = window.menuBar().addMenu("&Chat")
    for text, keys, slot in (
        ("New chat", QKeySequence.StandardKey.New, lambda: window.controller.new_conversation()),
        ("Choose model…", QKeySequence("Ctrl+L"), window.open_model_picker),
        (RESTART, None, window._restart_engine),
        ("Quit", QKeySequence.StandardKey.Quit, window.close),
    ):
        action = QAction(text, window)
        if keys is not None:
            action.setShortcut(keys)
        action.triggered.connect(slot)
        chat.addAction(action)
    ctrl_enter = QAction("Send with Ctrl+Enter", window, checkable=True)
    ctrl_enter.setChecked(window.settings.sends_on_ctrl_enter())
    ctrl_enter.toggled.connect(window._on_ctrl_enter_action_toggled)
    chat.insertAction(chat.actions()[-1], ctrl_enter)
    view = window.menuBar().addMenu("&View")
    view.addAction(window.performance_dock.toggleViewAction())
    view.addAction(window.server_dock.toggleViewAction())
    themes = view.addMenu("Theme")
    group = QActionGroup(window)
    for mode in MODES:
        action = themes.addAction(mode.capitalize() if mode != "system" else
                                  "Follow the system")
        action.setCheckable(True)
        action.setChecked(mode == window.theme.mode)
        action.triggered.connect(lambda _=False, m=mode: window.set_theme(m))
        group.addAction(action)
    window.menuBar().addMenu("&Help").addAction("Open the log folder", open_log_folder)


def open_log_folder() -> None:
    """The folder of hearth.log, to attach to a bug report."""
    QDesktopServices.openUrl(QUrl.fromLocalFile(str(data_dir())))
