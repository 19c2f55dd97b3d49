"""Banners over the top of the window's content instead of in its layout: one that appears or
goes never moves the chat under the pointer. The overlay is as wide as its parent and as tall
as the banners shown; with none shown it is hidden."""

from __future__ import annotations

from PySide6.QtCore import QEvent
from PySide6.QtWidgets import QVBoxLayout, QWidget


class BannerOverlay(QWidget):
    def __init__(self, parent: QWidget, banners: list[QWidget]) -> None:
        super().__init__(parent)
        self.setObjectName("bannerOverlay")
        self.banners = banners
        layout = QVBoxLayout(self)
        layout.setContentsMargins(8, 4, 8, 0)
        layout.setSpacing(4)
        for banner in banners:
            layout.addWidget(banner)
            banner.installEventFilter(self)
        parent.installEventFilter(self)
        self._place()

    def eventFilter(self, watched, event) -> bool:  # noqa: N802 (Qt override)
        # ShowToParent: a banner shown while the overlay is hidden gets no Show event
        if event.type() in (QEvent.Type.Resize, QEvent.Type.ShowToParent,
                            QEvent.Type.HideToParent, QEvent.Type.LayoutRequest):
            self._place()
        return False

    def _place(self) -> None:
        shown = [b for b in self.banners if not b.isHidden()]
        self.setVisible(bool(shown))
        if shown:
            width = self.parentWidget().width()
            self.layout().activate()
            height = self.layout().heightForWidth(width) if self.layout().hasHeightForWidth() \
                else self.sizeHint().height()
            self.setGeometry(0, 0, width, max(height, self.sizeHint().height()))
            self.raise_()
