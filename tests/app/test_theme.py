"""The dark theme: it follows the system's colour scheme unless chosen in View > Theme, is kept
for the next start, and reaches every part (palette, style sheet, code blocks, charts)."""

from __future__ import annotations

import re

from PySide6.QtCore import QSettings, qInstallMessageHandler
from PySide6.QtWidgets import QApplication, QFrame

from app.app_settings import AppSettings
from app.chat.markdown_view import CODE_BACKGROUND, MarkdownView
from app.paths import RESOURCES_DIR
from app.widgets import theme


def theme_action(window, text: str):
    [view] = [a.menu() for a in window.menuBar().actions() if a.text() == "&View"]
    [themes] = [a.menu() for a in view.actions() if a.text() == "Theme"]
    [action] = [a for a in themes.actions() if a.text() == text]
    return action


def test_both_style_sheets_parse(qtbot):
    """Qt drops a whole style sheet it cannot parse, saying so only on stderr (a `*/` inside a
    comment did it once)."""
    messages = []
    previous = qInstallMessageHandler(lambda _kind, _context, text: messages.append(text))
    app = QApplication.instance()
    before = app.styleSheet()
    try:
        for dark in (False, True):
            app.setStyleSheet(theme.style_sheet(dark))
            frame = QFrame()
            frame.setObjectName("userMessage")
            qtbot.addWidget(frame)
            frame.ensurePolished()
    finally:
        app.setStyleSheet(before)
        qInstallMessageHandler(previous)
    assert not [m for m in messages if "parse" in m.lower()], messages


def test_every_colour_of_the_light_style_sheet_has_a_dark_one():
    light = (RESOURCES_DIR / theme.STYLE_SHEET).read_text()
    colours = {c.lower() for c in re.findall(r"#[0-9a-fA-F]{6}\b", light)}
    assert colours and colours <= set(theme.DARK_COLORS)
    dark = theme.style_sheet(dark=True)
    assert not colours & {c.lower() for c in re.findall(r"#[0-9a-fA-F]{6}\b", dark)}
    assert dark.count("{") == light.count("{")  # the same rules, other colours


def test_the_dark_theme_reaches_every_part_and_is_kept(qtbot, make_window, settings):
    window = make_window()
    app = QApplication.instance()
    theme_action(window, "Dark").trigger()
    assert settings.theme() == "dark" and window.theme.is_dark
    assert theme.is_dark(app.palette()) and "#23272e" in app.styleSheet()
    assert window.performance_panel.speed_plot.backgroundBrush().color().name() == "#1e2126"
    view = MarkdownView()
    qtbot.addWidget(view)
    view.set_markdown("```python\nx = 1\n```")
    block = view.document().begin()
    assert block.blockFormat().background().color() == CODE_BACKGROUND[True]
    again = AppSettings(QSettings(settings.q.fileName(), QSettings.Format.IniFormat))
    assert again.theme() == "dark"
    theme_action(window, "Light").trigger()
    assert not theme.is_dark(app.palette()) and "#23272e" not in app.styleSheet()
    assert window.performance_panel.speed_plot.backgroundBrush().color().name() == "#ffffff"
    # a view already showing code takes the new colours when the palette changes
    assert view.document().begin().blockFormat().background().color() == CODE_BACKGROUND[False]


def test_system_mode_follows_the_colour_scheme(qtbot, make_window, monkeypatch):
    window = make_window(load=False)
    window.set_theme("system")
    scheme = [False]
    monkeypatch.setattr(theme, "system_is_dark", lambda: scheme[0])
    window.theme.apply()
    assert not window.theme.is_dark
    scheme[0] = True
    window.theme._on_hints_changed(None)  # what Qt 6.5+ sends when the desktop turns dark
    assert window.theme.is_dark and theme.is_dark(QApplication.instance().palette())
    window.set_theme("light")
    window.theme._on_hints_changed(None)  # a theme chosen by hand stays
    assert not window.theme.is_dark
