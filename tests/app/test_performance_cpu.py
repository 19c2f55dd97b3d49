"""The performance panel on every machine: on a CPU the worker's RSS and CPU use from its PID
(/proc), "no GPU" said once, lines broken across idle gaps, a time axis in seconds ago over a
1- or 5-minute window, and prefill speed only for prefills long enough to mean something."""

from __future__ import annotations

import math
import mmap
import os
import sys
import time

import numpy as np
import pytest

from app.widgets.chart_axis import MAX_GAP_S, WINDOWS_S
from app.worker.performance_panel import MIN_PREFILL_TOKENS, PerformancePanel
from app.worker.process_usage import ProcessSample, read_usage
from engine.events import Loaded, Stats
from engine.platform.gpu import GpuReport

GiB = 1 << 30
linux_only = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")


@linux_only
def test_read_usage_reads_this_process_and_refuses_a_gone_one(tmp_path):
    rss, cpu_s = read_usage(os.getpid())
    # RSS grows by what is touched: a fresh anonymous mapping, never pages the allocator already
    # holds resident (a bytearray can reuse a freed arena late in a long test run)
    block = mmap.mmap(-1, 64 << 20)
    for offset in range(0, len(block), 4096):
        block[offset] = 1
    rss_after, cpu_after = read_usage(os.getpid())
    assert rss_after - rss > 50 << 20 and cpu_after >= cpu_s > 0
    block.close()
    assert read_usage(2**22 + 12345) is None  # past pid_max: no such process
    # a command name with spaces and parentheses does not shift the fields
    fake = tmp_path / "77"
    fake.mkdir()
    fields = ["S"] + ["0"] * 10 + ["150", "50"] + ["0"] * 30
    (fake / "stat").write_text("77 (a (weird) name) " + " ".join(fields))
    (fake / "statm").write_text("1000 300 0 0 0 0 0")
    rss, cpu_s = read_usage(77, proc=tmp_path)
    assert rss == 300 * os.sysconf("SC_PAGE_SIZE")
    assert cpu_s == pytest.approx(200 / os.sysconf("SC_CLK_TCK"))


@linux_only
def test_on_a_cpu_the_panel_charts_the_workers_memory_and_cpu(qtbot, make_window):
    window = make_window()
    panel = window.performance_panel
    window._on_gpu_probe_report(GpuReport((), "no NVIDIA driver is installed"))
    pid = window.worker.pid
    assert panel.is_cpu_mode and panel.process_sampler.pid == pid  # Loaded.pid, kept
    assert panel.gpu_label.text() == ("No GPU: no NVIDIA driver is installed. Charted instead: "
                                      "the worker's memory and CPU use.")
    assert not panel.vram_note.isVisibleTo(panel)  # "no GPU" once, not twice
    assert not panel.vram_plot.isVisibleTo(panel) and panel.rss_plot.isVisibleTo(panel)
    samples = []
    panel.process_sampler.sig_sample.connect(samples.append)
    qtbot.waitUntil(lambda: len(samples) >= 1 and not math.isnan(samples[-1].cpu_percent),
                    timeout=5_000)
    assert samples[-1].rss_bytes == pytest.approx(read_usage(pid)[0], rel=0.5)
    assert 0 <= samples[-1].cpu_percent < 100 * os.cpu_count() + 50
    panel.redraw()
    rss = panel.curves["rss"].yData
    assert rss[-1] > 1 / 1024 and rss[-1] < 64  # GiB: a Python process, plausibly
    assert panel.curves["cpu"].yData is not None and len(panel.curves["cpu"].yData) >= 2


def test_an_idle_cpu_chart_never_goes_below_zero(qtbot):
    panel = PerformancePanel()
    qtbot.addWidget(panel)
    panel.set_loaded(Loaded("m", "LlamaForCausalLM", "cpu", "bf16", "bf16", 2048, 1, 1, pid=1))
    panel.show()
    t = time.monotonic()
    for i, cpu_percent in enumerate([0.3] * 5 + [0.0] * 5 + [40.0] * 5):  # idle, then busy
        panel.add_process_sample(ProcessSample(t + 0.5 * i, 100 << 20, cpu_percent))
    view = panel.cpu_plot.getViewBox()
    qtbot.waitUntil(lambda: view.viewRange()[1][1] >= 40.0, timeout=60_000)  # autorange saw them
    low, _high = view.viewRange()[1]
    assert low >= 0
    ticks = [v for _spacing, values in panel.cpu_plot.getAxis("left").tickValues(
        *view.viewRange()[1], 300) for v in values]
    assert ticks and min(ticks) >= 0


def test_a_gpu_load_charts_vram_again(qtbot):
    panel = PerformancePanel()
    qtbot.addWidget(panel)
    panel.set_loaded(Loaded("m", "LlamaForCausalLM", "cpu", "bf16", "bf16", 2048, 1, 1, pid=1))
    assert panel.rss_plot.isVisibleTo(panel)
    panel.set_loaded(Loaded("m", "LlamaForCausalLM", "cuda:0", "bf16", "bf16", 2048, 1, 1))
    assert panel.vram_plot.isVisibleTo(panel) and not panel.rss_plot.isVisibleTo(panel)
    assert panel.process_sampler.pid == 0  # nothing sampled from /proc on a GPU


def test_lines_break_across_idle_gaps(qtbot):
    panel = PerformancePanel()
    qtbot.addWidget(panel)
    t0 = panel._t0
    for t in (1.0, 1.5, 2.0, 30.0, 30.5):  # an answer, a long pause, another answer
        panel.add_process_sample(ProcessSample(t0 + t, float(GiB), 50.0))
    times, rss = panel.rss.times(), panel.rss.series("rss")
    assert np.isnan(rss).sum() == 1  # one break, inside the pause
    gap = int(np.flatnonzero(np.isnan(rss))[0])
    assert times[gap - 1] == 2.0 and 2.0 < times[gap] < 30.0 and times[gap + 1] == 30.0
    for t in (31.0, 31.0 + MAX_GAP_S * 0.9):  # a short pause is no gap
        panel.add_process_sample(ProcessSample(t0 + t, float(GiB), 50.0))
    assert np.isnan(panel.rss.series("rss")).sum() == 1
    panel.redraw()
    assert panel.curves["rss"].opts["connect"] == "finite"  # nan breaks the drawn line


def test_the_time_axis_is_seconds_ago_over_a_sliding_window(qtbot, monkeypatch):
    panel = PerformancePanel()
    qtbot.addWidget(panel)
    now = [100.0]
    monkeypatch.setattr(panel, "_now", lambda: now[0])
    panel._slide()
    (x0, x1), _ = panel.speed_plot.viewRange()
    assert (x0, x1) == pytest.approx((100.0 - 60, 100.0))
    axis = panel.speed_plot.getAxis("bottom")
    [(step, ticks)] = axis.tickValues(x0, x1, 400)
    assert axis.tickStrings(ticks, 1.0, step)[:3] == ["0", "10", "20"]
    assert axis.labelText == "seconds ago"
    panel.window_combo.setCurrentText("Last 5 minutes")
    assert panel.window_s == WINDOWS_S["Last 5 minutes"] == 300
    (x0, x1), _ = panel.cpu_plot.viewRange()
    assert (x0, x1) == pytest.approx((100.0 - 300, 100.0))
    now[0] = 130.0  # time passes with no sample: the view slides all the same
    panel._slide()
    assert panel.speed_plot.viewRange()[0] == pytest.approx([130.0 - 300, 130.0])


def test_prefill_speed_only_for_prefills_long_enough(qtbot):
    panel = PerformancePanel()
    qtbot.addWidget(panel)
    panel.add_stats(Stats(decode_tokens_per_s=30.0, prefill_tokens_per_s=9000.0,
                          prompt_tokens=12, computed_prompt_tokens=12))
    assert math.isnan(panel.speed.last("prefill")) and panel.speed.last("decode") == 30.0
    assert "prefill" not in panel.latency_label.text()
    panel.add_stats(Stats(decode_tokens_per_s=30.0, prefill_tokens_per_s=800.0,
                          prompt_tokens=2000, cached_prompt_tokens=2000 - MIN_PREFILL_TOKENS,
                          computed_prompt_tokens=MIN_PREFILL_TOKENS))
    assert panel.speed.last("prefill") == 800.0
    assert "prefill 800 tokens/s" in panel.latency_label.text()
    # most of a long prompt came from the cache: its short prefill is not charted
    panel.add_stats(Stats(decode_tokens_per_s=30.0, prefill_tokens_per_s=5000.0,
                          prompt_tokens=2000, cached_prompt_tokens=1990,
                          computed_prompt_tokens=10))
    assert math.isnan(panel.speed.last("prefill"))


def test_the_charts_follow_the_theme(qtbot):
    panel = PerformancePanel()
    qtbot.addWidget(panel)
    panel.set_dark(True)
    assert panel.speed_plot.backgroundBrush().color().name() == "#1e2126"
    panel.set_dark(False)
    assert panel.speed_plot.backgroundBrush().color().name() == "#ffffff"
