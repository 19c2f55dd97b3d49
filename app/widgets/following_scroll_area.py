"""A scroll area that follows its bottom as its content grows (a streaming answer), as chat apps
do: while the view is at the bottom it stays there; once the user scrolls up it stays where the
user put it, and a "Jump to latest" button over the view's bottom brings it back (and following
resumes). It reacts to the scroll bar's range, which changes once per layout, never per token."""

from __future__ import annotations

from PySide6.QtCore import QEvent, Qt
from PySide6.QtWidgets import QScrollArea, QToolButton

AT_BOTTOM_PX = 4  # this close to the end counts as at the bottom (rounding, a 1 px layout)
BUTTON_MARGIN_PX = 12


class FollowingScrollArea(QScrollArea):
    def __init__(self, parent=None) -> None:
        super().__init__(parent)
        self.is_following = True  # the view is (and stays) at the bottom
        self.jump_button = QToolButton(self)
        self.jump_button.setObjectName("jumpToLatestButton")
        self.jump_button.setText("Jump to latest \u2193")
        self.jump_button.setToolTip("Scroll to the end of the conversation and follow it")
        self.jump_button.setCursor(Qt.CursorShape.PointingHandCursor)
        self.jump_button.setVisible(False)
        bar = self.verticalScrollBar()
        bar.rangeChanged.connect(self._on_bar_range_changed)
        bar.valueChanged.connect(self._on_bar_value_changed)
        self.jump_button.clicked.connect(self.follow)
        self.viewport().installEventFilter(self)  # the button keeps to the view's bottom

    def follow(self) -> None:
        """To the bottom now, and stay there as the content grows."""
        self.is_following = True
        bar = self.verticalScrollBar()
        bar.setValue(bar.maximum())
        self._show_jump_button()

    @property
    def is_at_bottom(self) -> bool:
        bar = self.verticalScrollBar()
        return bar.value() >= bar.maximum() - AT_BOTTOM_PX

    def eventFilter(self, watched, event) -> bool:  # noqa: N802 (Qt override)
        if watched is self.viewport() and event.type() == QEvent.Type.Resize:
            self._place_jump_button()
        return False

    def _on_bar_range_changed(self, _minimum: int, maximum: int) -> None:
        if self.is_following:
            self.verticalScrollBar().setValue(maximum)
        self._show_jump_button()

    def _on_bar_value_changed(self, _value: int) -> None:
        # the user's scrolling (wheel, bar, keys) decides: up stops following, down to the
        # bottom starts it again; the area's own moves land at the bottom and keep it
        self.is_following = self.is_at_bottom
        self._show_jump_button()

    def _show_jump_button(self) -> None:
        shows = not self.is_following and not self.is_at_bottom
        if shows == self.jump_button.isHidden():
            self.jump_button.setVisible(shows)
            if shows:
                self._place_jump_button()

    def _place_jump_button(self) -> None:
        self.jump_button.adjustSize()
        view = self.viewport().geometry()  # in this widget's coordinates
        self.jump_button.move(view.center().x() - self.jump_button.width() // 2,
                              view.bottom() - self.jump_button.height() - BUTTON_MARGIN_PX)
        self.jump_button.raise_()
