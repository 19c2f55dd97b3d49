"""Light and dark: the palette (Fusion's, so both look alike everywhere) and the style sheet,
the dark one being the light hearth.qss with each colour swapped for its dark counterpart.
"system" follows the desktop's colour scheme (Qt 6.5+) as it changes."""

from __future__ import annotations

import re

from PySide6.QtCore import QObject, Qt, Signal
from PySide6.QtGui import QColor, QGuiApplication, QPalette

from app.paths import RESOURCES_DIR

MODES = ("system", "light", "dark")
STYLE_SHEET = "hearth.qss"
# every colour hearth.qss uses -> the dark theme's (tests check none is left out)
DARK_COLORS = {
    "#2e7d32": "#81c784", "#616161": "#b0b0b0", "#757575": "#9e9e9e", "#b26a00": "#ffb74d",
    "#b6dcf7": "#2d5a80", "#c62828": "#ef9a9a", "#d6e2f5": "#34465e", "#e3e3e3": "#3a3f47",
    "#e8f4fd": "#1c3346", "#eef4ff": "#243247", "#f5c2bd": "#7a3a36", "#fafafa": "#262a30",
    "#fdecea": "#3d2321", "#fff8e1": "#3b3322", "#ffffff": "#23272e", "#d0d0d0": "#4a505a",
    "#424242": "#e0e0e0",
}
HEX_COLOR = re.compile(r"#[0-9a-fA-F]{6}\b")
# (role, colour) of the dark palette; the light one is Fusion's own
DARK_PALETTE = (
    (QPalette.ColorRole.Window, "#1e2126"), (QPalette.ColorRole.WindowText, "#e6e6e6"),
    (QPalette.ColorRole.Base, "#181a1f"), (QPalette.ColorRole.AlternateBase, "#23272e"),
    (QPalette.ColorRole.Text, "#e6e6e6"), (QPalette.ColorRole.Button, "#2a2e35"),
    (QPalette.ColorRole.ButtonText, "#e6e6e6"), (QPalette.ColorRole.ToolTipBase, "#2a2e35"),
    (QPalette.ColorRole.ToolTipText, "#e6e6e6"), (QPalette.ColorRole.Highlight, "#3d6fb5"),
    (QPalette.ColorRole.HighlightedText, "#ffffff"), (QPalette.ColorRole.Link, "#7fb3ff"),
    (QPalette.ColorRole.PlaceholderText, "#8a8f98"), (QPalette.ColorRole.Mid, "#3a3f47"),
    (QPalette.ColorRole.Dark, "#15171b"), (QPalette.ColorRole.Light, "#3a3f47"),
)


def is_dark(palette: QPalette) -> bool:
    """Whether a widget is drawn dark: its window colour, whatever set it."""
    return palette.color(QPalette.ColorRole.Window).lightness() < 128


def system_is_dark() -> bool:
    hints = QGuiApplication.styleHints()
    return hints.colorScheme() == Qt.ColorScheme.Dark


def style_sheet(dark: bool) -> str:
    path = RESOURCES_DIR / STYLE_SHEET
    light = path.read_text(encoding="utf-8") if path.is_file() else ""
    if not dark:
        return light
    return HEX_COLOR.sub(lambda m: DARK_COLORS.get(m.group(0).lower(), m.group(0)), light)


def palette(dark: bool) -> QPalette:
    app = QGuiApplication.instance()
    base = app.style().standardPalette() if hasattr(app, "style") else QPalette()
    if not dark:
        return base
    for role, color in DARK_PALETTE:
        base.setColor(role, QColor(color))
    for role in (QPalette.ColorRole.Text, QPalette.ColorRole.ButtonText,
                 QPalette.ColorRole.WindowText):
        base.setColor(QPalette.ColorGroup.Disabled, role, QColor("#6b7078"))
    return base


class Theme(QObject):
    """The theme in force; `mode` is "system", "light" or "dark"."""

    sig_changed = Signal(bool)
    """The theme was applied: True when it is dark."""

    def __init__(self, mode: str = "system", parent: QObject | None = None) -> None:
        super().__init__(parent)
        self.mode = mode if mode in MODES else "system"
        self.is_dark = False
        QGuiApplication.styleHints().colorSchemeChanged.connect(self._on_hints_changed)

    def set_mode(self, mode: str) -> None:
        self.mode = mode if mode in MODES else "system"
        self.apply()

    def apply(self) -> None:
        app = QGuiApplication.instance()
        self.is_dark = self.mode == "dark" or (self.mode == "system" and system_is_dark())
        if hasattr(app, "setStyle"):
            app.setStyle("Fusion")  # the platform's style may ignore a palette (Windows 11's)
        app.setPalette(palette(self.is_dark))
        if hasattr(app, "setStyleSheet"):
            app.setStyleSheet(style_sheet(self.is_dark))
        self.sig_changed.emit(self.is_dark)

    def _on_hints_changed(self, _scheme) -> None:
        if self.mode == "system":
            self.apply()
