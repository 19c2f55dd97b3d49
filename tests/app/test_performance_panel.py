"""The performance panel: ring buffers, redraws from its timer, samples from the stream."""

from __future__ import annotations

import math

import numpy as np

from app.widgets.ring_buffer import RingBuffer
from app.worker.gpu_probe import VramSample
from app.worker.performance_panel import REDRAW_INTERVAL_MS, PerformancePanel
from engine.events import Loaded, Stats
from engine.platform.gpu import GpuReport

GiB = 1 << 30


def test_ring_buffer_keeps_the_newest_in_order():
    ring = RingBuffer(4, ("a", "b"))
    assert ring.times().size == 0 and math.isnan(ring.last("a"))
    for i in range(6):
        ring.append(float(i), i * 10.0, None)
    assert ring.size == 4
    np.testing.assert_array_equal(ring.times(), [2, 3, 4, 5])
    np.testing.assert_array_equal(ring.series("a"), [20, 30, 40, 50])
    assert np.isnan(ring.series("b")).all()
    assert ring.last("a") == 50.0


def test_panel_buffers_samples_and_redraws_from_its_timer(qtbot):
    panel = PerformancePanel()
    qtbot.addWidget(panel)
    for i in range(30):
        panel.add_stats(Stats(decode_tokens_per_s=40.0 + i, prefill_tokens_per_s=600.0,
                              vram_used_bytes=3 * GiB, kv_cache_bytes=GiB // 2, ttft_ms=35.0,
                              accepted_draft_tokens=3, proposed_draft_tokens=4,
                              prompt_tokens=1240, cached_prompt_tokens=1200,
                              computed_prompt_tokens=40))
    assert panel.speed.size == 30 and panel.vram.size == 30
    assert panel.num_redraws == 0  # nothing drawn per sample
    qtbot.waitUntil(lambda: panel.num_redraws >= 1, timeout=REDRAW_INTERVAL_MS * 10)
    x, y = panel.curves["decode"].xData, panel.curves["decode"].yData
    assert len(x) == 30 and y[-1] == 69.0
    process = panel.curves["process"].yData
    assert process[-1] == 3.0  # GiB
    assert "draft acceptance 75%" in panel.latency_label.text()
    assert "prompt 1,200 cached + 40 computed" in panel.latency_label.text()
    redraws = panel.num_redraws
    qtbot.wait(REDRAW_INTERVAL_MS * 3)
    assert panel.num_redraws == redraws  # no new samples: no redraw


def test_nvml_samples_take_over_the_vram_chart(qtbot):
    panel = PerformancePanel()
    qtbot.addWidget(panel)
    panel.add_vram_sample(VramSample(panel._t0 + 1.0, 10.0 * GiB, 4.0 * GiB))
    panel.add_stats(Stats(vram_used_bytes=3 * GiB, kv_cache_bytes=GiB))
    panel.add_vram_sample(VramSample(panel._t0 + 2.0, 11.0 * GiB, None))
    assert panel.vram.size == 2  # the worker's own figure is not mixed in
    panel.redraw()
    device = panel.curves["device"].yData
    kv = panel.curves["kv_cache"].yData
    assert list(device) == [10.0, 11.0] and kv[-1] == 1.0


def test_cpu_mode_charts_the_worker_instead_of_an_empty_vram_chart(qtbot):
    panel = PerformancePanel()
    qtbot.addWidget(panel)
    panel.set_gpu_report(GpuReport((), "no NVIDIA driver is installed; CPU mode"))
    assert "no NVIDIA driver" in panel.gpu_label.text()
    panel.set_loaded(Loaded("demo", "Qwen2ForCausalLM", "cpu", "fp32", "fp32", 2048, 1, 1))
    # the CPU's side takes the VRAM chart's place, and "no GPU" is said once, not twice
    assert not panel.vram_plot.isVisibleTo(panel)
    assert panel.rss_plot.isVisibleTo(panel) and panel.cpu_plot.isVisibleTo(panel)
    assert not panel.vram_note.isVisibleTo(panel)


def test_the_window_panel_receives_the_stream(qtbot, make_window):
    window = make_window()
    window.chat_view.input.setPlainText("hi")
    with qtbot.waitSignal(window.worker.sig_finished, timeout=10_000):
        window.chat_view.send_button.click()
    panel = window.performance_panel
    assert panel.speed.size == 3  # two Stats events and Finished.stats
    assert panel.speed.last("decode") == 41.5
    qtbot.waitUntil(lambda: panel.curves["decode"].xData is not None
                    and len(panel.curves["decode"].xData) == 3, timeout=2_000)
