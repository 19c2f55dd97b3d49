"""Live charts of the last minutes: VRAM (card, worker process, KV cache) and tokens per second
(decode, prefill), plus time to first token and draft acceptance. Samples go into ring buffers
as they come; a QTimer redraws at ~10 Hz, never once per token."""

from __future__ import annotations

import math
import time

import pyqtgraph as pg
from PySide6.QtCore import QTimer
from PySide6.QtWidgets import QLabel, QVBoxLayout, QWidget

from app import fit_check
from app.gpu_probe import VramSample
from app.ring_buffer import RingBuffer
from engine.events import Loaded, Stats
from engine.gpu import GpuReport

GiB = fit_check.GiB
REDRAW_INTERVAL_MS = 100
CAPACITY = 3600  # samples kept per chart: an hour of 1 Hz VRAM, minutes of token stats
VRAM_SERIES = ("device", "process", "kv_cache")
SPEED_SERIES = ("decode", "prefill")
PENS = {"device": "#9e9e9e", "process": "#1976d2", "kv_cache": "#ef6c00",
        "decode": "#2e7d32", "prefill": "#6a1b9a"}
LEGEND = {"device": "card (all processes)", "process": "worker process", "kv_cache": "KV cache",
          "decode": "decode tokens/s", "prefill": "prefill tokens/s"}


class PerformancePanel(QWidget):
    def __init__(self, parent=None) -> None:
        super().__init__(parent)
        self.vram = RingBuffer(CAPACITY, VRAM_SERIES)
        self.speed = RingBuffer(CAPACITY, SPEED_SERIES)
        self.num_redraws = 0
        self._t0 = time.monotonic()
        self._is_dirty = False
        self._has_nvml_samples = False
        self._last_kv_bytes = math.nan

        self.gpu_label = QLabel("Looking for a GPU…")
        self.gpu_label.setWordWrap(True)
        self.latency_label = QLabel("No generation yet.")
        self.latency_label.setWordWrap(True)
        self.vram_note = QLabel()  # why the VRAM chart is empty, when it is
        self.vram_note.setWordWrap(True)
        self.vram_note.setVisible(False)
        self.vram_plot = pg.PlotWidget(title="VRAM (GiB)", background="w")
        self.speed_plot = pg.PlotWidget(title="Tokens per second", background="w")
        self.curves: dict[str, pg.PlotDataItem] = {}
        for plot, names in ((self.vram_plot, VRAM_SERIES), (self.speed_plot, SPEED_SERIES)):
            plot.setClipToView(True)
            plot.setDownsampling(auto=True, mode="peak")
            plot.setLabel("bottom", "seconds")
            for side in ("bottom", "left"):
                plot.getAxis(side).enableAutoSIPrefix(False)  # no "(x0.001)" on short runs
            plot.addLegend(offset=(5, 5))
            plot.showGrid(x=True, y=True, alpha=0.2)
            for name in names:
                self.curves[name] = plot.plot(pen=pg.mkPen(PENS[name], width=2), name=LEGEND[name],
                                              connect="finite")

        layout = QVBoxLayout(self)
        layout.addWidget(self.gpu_label)
        layout.addWidget(self.latency_label)
        layout.addWidget(self.vram_note)
        layout.addWidget(self.vram_plot, 1)
        layout.addWidget(self.speed_plot, 1)

        self._timer = QTimer(self)
        self._timer.setInterval(REDRAW_INTERVAL_MS)
        self._timer.timeout.connect(self._on_timer_timeout)
        self._timer.start()

    # ------------------------------------------------------------------ samples in

    def set_gpu_report(self, report: GpuReport) -> None:
        gpu = fit_check.first_gpu(report)
        if gpu is None:
            self.gpu_label.setText(f"No GPU: {report.reason}")
            self._set_vram_empty(f"No VRAM to chart: {report.reason}")
        else:
            self.gpu_label.setText(
                f"{gpu.name} · {gpu.total_bytes / GiB:.1f} GiB · driver {gpu.driver_version}")

    def set_loaded(self, event: Loaded) -> None:
        if event.device == "cpu":
            self._set_vram_empty("The model runs on the CPU: there is no VRAM to chart.")
        else:
            self._set_vram_empty("")

    def add_stats(self, stats: Stats) -> None:
        t = self._now()
        self.speed.append(t, stats.decode_tokens_per_s or math.nan,
                          stats.prefill_tokens_per_s or math.nan)
        self._last_kv_bytes = float(stats.kv_cache_bytes)
        if not self._has_nvml_samples and stats.vram_used_bytes:
            # no NVML reading of the worker: chart what the worker says it uses
            self.vram.append(t, math.nan, float(stats.vram_used_bytes), self._last_kv_bytes)
        self._show_latency(stats)
        self._is_dirty = True

    def add_vram_sample(self, sample: VramSample) -> None:
        self._has_nvml_samples = True
        self.vram.append(sample.t - self._t0, sample.device_used_bytes,
                         sample.process_used_bytes, self._last_kv_bytes)
        self._is_dirty = True

    # ------------------------------------------------------------------ drawing

    def redraw(self) -> None:
        for buffer, scale in ((self.vram, 1 / GiB), (self.speed, 1.0)):
            t = buffer.times()
            for name in buffer.names:
                self.curves[name].setData(t, buffer.series(name) * scale)
        self.num_redraws += 1
        self._is_dirty = False

    def _on_timer_timeout(self) -> None:
        if self._is_dirty:
            self.redraw()

    def _show_latency(self, stats: Stats) -> None:
        parts = [f"decode {stats.decode_tokens_per_s:.1f} tokens/s",
                 f"prefill {stats.prefill_tokens_per_s:.0f} tokens/s",
                 f"first token {stats.ttft_ms:.0f} ms"]
        if stats.prompt_tokens:  # K/V kept from earlier turns versus prefilled for this one
            parts.append(f"prompt {stats.cached_prompt_tokens:,} cached + "
                         f"{stats.computed_prompt_tokens:,} computed")
        if stats.proposed_draft_tokens:
            rate = stats.accepted_draft_tokens / stats.proposed_draft_tokens
            how = stats.speculation.replace("_", " ") or "draft"
            parts.append(f"{how} acceptance {rate:.0%}")
            if stats.mean_accepted_length:
                parts.append(f"{stats.mean_accepted_length:.1f} tokens a step")
            if stats.speculative_speedup:
                parts.append(f"{stats.speculative_speedup:.2f}x a plain step")
            if stats.speculation_switched_off:
                parts.append("speculation paused: not paying off")
        self.latency_label.setText(" · ".join(parts))

    def _set_vram_empty(self, text: str) -> None:
        self.vram_note.setText(text)
        self.vram_note.setVisible(bool(text))

    def _now(self) -> float:
        return time.monotonic() - self._t0
