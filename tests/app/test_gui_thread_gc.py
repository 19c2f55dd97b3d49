"""Garbage cycles are collected on the GUI thread, whichever thread allocates (GuiThreadGC)."""

from __future__ import annotations

import gc
import threading

from app.gui_thread_gc import GuiThreadGC


class Marker:
    """A garbage cycle that writes down the thread that collects it."""

    def __init__(self, seen: list):
        self.seen, self.me = seen, self

    def __del__(self):
        self.seen.append(threading.current_thread())


def make_garbage_on_a_thread(seen: list) -> list:
    """A Marker cycle made garbage on a thread, then allocations there far past generation 0's
    threshold; returns what they allocated, alive (the count is of live containers made since
    the last collection: a list freed at once takes its count back)."""
    kept: list = []

    def run():
        Marker(seen)
        kept.extend([] for _ in range(20 * gc.get_threshold()[0]))

    thread = threading.Thread(target=run)
    thread.start()
    thread.join()
    return kept


def test_without_it_a_threads_allocations_collect_on_that_thread():
    """The hazard itself (so the test below can fail): automatic collection runs wherever the
    threshold is crossed."""
    gc.collect()
    gc.enable()
    try:
        seen: list = []
        kept = make_garbage_on_a_thread(seen)
        del kept
        assert seen and seen[0] is not threading.main_thread()
    finally:
        gc.disable()  # as the app tests' fixture keeps it


def test_garbage_made_on_a_thread_is_collected_on_the_gui_thread(qtbot):
    gc.collect()
    gc.enable()
    collector = GuiThreadGC(interval_ms=20)
    try:
        assert not gc.isenabled()
        seen: list = []
        kept = make_garbage_on_a_thread(seen)
        assert seen == []  # nothing collected on the thread
        qtbot.waitUntil(lambda: bool(seen), timeout=5000)
        assert seen == [threading.main_thread()]
        del kept
    finally:
        collector.stop()
    assert gc.isenabled()  # stop() puts automatic collection back as it was
    gc.disable()


def test_nothing_is_collected_before_a_threshold_is_crossed(qtbot):
    gc.collect()
    collector = GuiThreadGC(interval_ms=10_000)
    try:
        seen: list = []
        Marker(seen)
        assert collector.collect_due() == 0 and seen == []
        kept = [[] for _ in range(2 * gc.get_threshold()[0])]
        assert collector.collect_due() >= 1 and len(seen) == 1
        del kept
    finally:
        collector.stop()
