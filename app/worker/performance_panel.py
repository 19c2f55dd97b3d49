"""Live charts of the last minutes: VRAM (card, worker process, KV cache) and tokens per second
(decode, prefill), plus time to first token and draft acceptance. For a model on an endpoint
there is no VRAM of this machine to chart: time to first token is charted instead, measured from
the stream, and the panel says where the model runs. On a CPU the worker's memory (RSS) and CPU
use take the VRAM chart's place (process_usage.py). The time axis is seconds ago over a sliding
window; a pause breaks the lines. Samples go into ring buffers as they come; a QTimer redraws at
~10 Hz, never once per token."""

from __future__ import annotations

import math
import time

import pyqtgraph as pg
from PySide6.QtCore import QTimer
from PySide6.QtWidgets import QComboBox, QHBoxLayout, QLabel, QVBoxLayout, QWidget

from app.models import fit_check
from app.widgets.chart_axis import MAX_GAP_S, WINDOWS_S, SecondsAgoAxis
from app.widgets.ring_buffer import RingBuffer
from app.worker.gpu_probe import VramSample
from app.worker.process_usage import ProcessSample, ProcessSampler, is_supported
from engine.events import Loaded, Stats
from engine.platform.gpu import GpuReport

GiB = fit_check.GiB
REDRAW_INTERVAL_MS = 100
SLIDE_EVERY_TICKS = 5  # the time axis slides twice a second, idle or not
CAPACITY = 3600  # samples kept per chart: an hour of 1 Hz VRAM, minutes of token stats
VRAM_SERIES = ("device", "process", "kv_cache")
SPEED_SERIES = ("decode", "prefill")
TTFT_SERIES = ("ttft",)
RSS_SERIES = ("rss",)
CPU_SERIES = ("cpu",)
PENS = {"device": "#9e9e9e", "process": "#1976d2", "kv_cache": "#ef6c00",
        "decode": "#2e7d32", "prefill": "#6a1b9a", "ttft": "#c62828", "rss": "#1976d2",
        "cpu": "#ef6c00"}
LEGEND = {"device": "card (all processes)", "process": "worker process", "kv_cache": "KV cache",
          "decode": "decode tokens/s", "prefill": "prefill tokens/s",
          "ttft": "time to first token (ms)", "rss": "worker memory (RSS)",
          "cpu": "worker CPU (100% = one core)"}
# a prefill shorter than this is over before its speed means anything: not charted
MIN_PREFILL_TOKENS = 64
CHART_COLORS = {False: ("#ffffff", "#424242"), True: ("#1e2126", "#c8c8c8")}  # background, text


class PerformancePanel(QWidget):
    def __init__(self, parent=None) -> None:
        super().__init__(parent)
        self.vram = RingBuffer(CAPACITY, VRAM_SERIES)
        self.speed = RingBuffer(CAPACITY, SPEED_SERIES)
        self.ttft = RingBuffer(CAPACITY, TTFT_SERIES)
        self.rss = RingBuffer(CAPACITY, RSS_SERIES)
        self.cpu = RingBuffer(CAPACITY, CPU_SERIES)
        self.is_cpu_mode = False  # the worker's RSS and CPU charted instead of VRAM
        self.window_s = next(iter(WINDOWS_S.values()))
        self.process_sampler = ProcessSampler(self)
        self.remote_where = ""  # host[:port] of the endpoint the model runs on; "" for local
        self.num_redraws = 0
        self._num_ticks = 0
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
        self.window_combo = QComboBox()
        self.window_combo.addItems(list(WINDOWS_S))
        self.window_combo.setToolTip("How far back the charts reach")
        self.titles = {}
        self.vram_plot = self._plot("VRAM (GiB)")
        self.speed_plot = self._plot("Tokens per second")
        self.ttft_plot = self._plot("Time to first token (ms)")
        self.ttft_plot.setVisible(False)  # in the VRAM chart's place, for a remote model
        self.rss_plot = self._plot("Worker memory (GiB)")
        self.cpu_plot = self._plot("Worker CPU use (%)")
        for plot in (self.rss_plot, self.cpu_plot):
            plot.setVisible(False)  # in the VRAM chart's place, on a CPU
        self.curves: dict[str, pg.PlotDataItem] = {}
        for plot, names in ((self.vram_plot, VRAM_SERIES), (self.speed_plot, SPEED_SERIES),
                            (self.ttft_plot, TTFT_SERIES), (self.rss_plot, RSS_SERIES),
                            (self.cpu_plot, CPU_SERIES)):
            plot.setClipToView(True)
            plot.setDownsampling(auto=True, mode="peak")
            plot.getAxis("left").enableAutoSIPrefix(False)  # no "(x0.001)" on short runs
            plot.setXRange(-self.window_s, 0, padding=0)  # until the first slide
            plot.setMouseEnabled(x=False, y=False)  # the window slides; dragging would fight it
            # every charted figure is >= 0: autorange's padding must not draw a negative axis
            plot.getViewBox().setLimits(yMin=0)
            plot.addLegend(offset=(5, 5))
            plot.showGrid(x=True, y=True, alpha=0.2)
            for name in names:
                self.curves[name] = plot.plot(pen=pg.mkPen(PENS[name], width=2), name=LEGEND[name],
                                              connect="finite")

        layout = QVBoxLayout(self)
        layout.addWidget(self.gpu_label)
        layout.addWidget(self.latency_label)
        window = QHBoxLayout()
        window.addStretch(1)
        window.addWidget(self.window_combo)
        layout.addLayout(window)
        layout.addWidget(self.vram_note)
        layout.addWidget(self.vram_plot, 1)
        layout.addWidget(self.rss_plot, 1)
        layout.addWidget(self.cpu_plot, 1)
        layout.addWidget(self.ttft_plot, 1)
        layout.addWidget(self.speed_plot, 1)
        self.window_combo.currentTextChanged.connect(self._on_window_combo_text_changed)
        self.process_sampler.sig_sample.connect(self.add_process_sample)

        self._timer = QTimer(self)
        self._timer.setInterval(REDRAW_INTERVAL_MS)
        self._timer.timeout.connect(self._on_timer_timeout)
        self._timer.start()

    # ------------------------------------------------------------------ samples in

    def set_gpu_report(self, report: GpuReport) -> None:
        gpu = fit_check.first_gpu(report)
        if gpu is None:  # said once, here; the charts show the CPU's side instead of VRAM
            self.gpu_label.setText(f"No GPU: {report.reason.rstrip('.')}. Charted instead: the "
                                   "worker's memory and CPU use.")
            self.set_cpu_mode(True)
        else:
            self.gpu_label.setText(
                f"{gpu.name} · {gpu.total_bytes / GiB:.1f} GiB · driver {gpu.driver_version}")

    def set_loaded(self, event: Loaded) -> None:
        self._show_remote("")
        self.set_cpu_mode(event.device == "cpu", event.pid)

    def set_cpu_mode(self, on: bool, pid: int | None = None) -> None:
        """Chart the worker's RSS and CPU use (from its PID; None: the one watched) instead
        of VRAM."""
        self.is_cpu_mode = on
        self.process_sampler.watch((self.process_sampler.pid if pid is None else pid) if on
                                   else 0)
        if self.remote_where:  # the endpoint's note stays: a late GPU report must not wipe it
            return
        self.vram_plot.setVisible(not on)
        for plot in (self.rss_plot, self.cpu_plot):
            plot.setVisible(on)
        self._set_vram_empty("" if not on or is_supported() else
                             "This system does not let Hearth read the worker's memory and CPU "
                             "use, so there is nothing to chart but speed.")

    def set_remote(self, where: str) -> None:
        """The model runs on the endpoint at `where` (host:port): no VRAM chart here."""
        self._show_remote(where)
        self.process_sampler.watch(0)
        self._set_vram_empty(f"The model runs on the endpoint at {where}: its VRAM is not "
                             "this machine's to chart. Speeds are measured from the stream.")

    def add_stats(self, stats: Stats) -> None:
        t = self._now()
        if self.remote_where and stats.ttft_ms:
            _append(self.ttft, t, stats.ttft_ms)
        prefilled = stats.computed_prompt_tokens or stats.prompt_tokens
        prefill = stats.prefill_tokens_per_s if prefilled >= MIN_PREFILL_TOKENS else 0.0
        _append(self.speed, t, stats.decode_tokens_per_s or math.nan, prefill or math.nan)
        self._last_kv_bytes = float(stats.kv_cache_bytes)
        if self.is_cpu_mode and stats.pid:
            self.process_sampler.watch(stats.pid)  # a restarted worker has a new PID
        if not self._has_nvml_samples and stats.vram_used_bytes and not self.is_cpu_mode:
            # no NVML reading of the worker: chart what the worker says it uses
            _append(self.vram, t, math.nan, float(stats.vram_used_bytes), self._last_kv_bytes)
        self._show_latency(stats)
        self._is_dirty = True

    def add_vram_sample(self, sample: VramSample) -> None:
        self._has_nvml_samples = True
        _append(self.vram, sample.t - self._t0, sample.device_used_bytes,
                sample.process_used_bytes, self._last_kv_bytes)
        self._is_dirty = True

    def add_process_sample(self, sample: ProcessSample) -> None:
        t = sample.t - self._t0
        _append(self.rss, t, sample.rss_bytes)
        _append(self.cpu, t, sample.cpu_percent)
        self._is_dirty = True

    def set_dark(self, dark: bool) -> None:
        """The charts in the theme's colours."""
        background, text = CHART_COLORS[dark]
        for plot, title in self.titles.items():
            plot.setBackground(background)
            plot.setTitle(title, color=text)
            for side in ("bottom", "left"):
                plot.getAxis(side).setTextPen(text)
                plot.getAxis(side).setPen(text)
            legend = plot.getPlotItem().legend
            if legend is not None:
                legend.setLabelTextColor(text)

    # ------------------------------------------------------------------ drawing

    def redraw(self) -> None:
        for buffer, scale in ((self.vram, 1 / GiB), (self.speed, 1.0), (self.ttft, 1.0),
                              (self.rss, 1 / GiB), (self.cpu, 1.0)):
            t = buffer.times()
            for name in buffer.names:
                self.curves[name].setData(t, buffer.series(name) * scale)
        self.num_redraws += 1
        self._is_dirty = False

    def _on_timer_timeout(self) -> None:
        if self._is_dirty:
            self.redraw()
        self._num_ticks += 1
        if self._num_ticks % SLIDE_EVERY_TICKS == 0:
            self._slide()

    def _slide(self) -> None:
        """The window moves with time, new samples or not: only the view moves, no data."""
        now = self._now()
        for plot in self.titles:
            plot.setXRange(now - self.window_s, now, padding=0)

    def _on_window_combo_text_changed(self, text: str) -> None:
        self.window_s = WINDOWS_S[text]
        self._slide()

    def _plot(self, title: str) -> pg.PlotWidget:
        plot = pg.PlotWidget(title=title, background="w",
                             axisItems={"bottom": SecondsAgoAxis(lambda: self._now())})
        self.titles[plot] = title
        return plot

    def _show_latency(self, stats: Stats) -> None:
        if self.remote_where:  # an endpoint does not report its prefill speed
            self.latency_label.setText(
                f"{stats.decode_tokens_per_s:.1f} tokens/s · first token {stats.ttft_ms:.0f} ms"
                f" · {stats.new_tokens:,} tokens · on {self.remote_where}")
            return
        parts = [f"decode {stats.decode_tokens_per_s:.1f} tokens/s"]
        if (stats.computed_prompt_tokens or stats.prompt_tokens) >= MIN_PREFILL_TOKENS:
            parts.append(f"prefill {stats.prefill_tokens_per_s:.0f} tokens/s")
        parts.append(f"first token {stats.ttft_ms:.0f} ms")
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

    def _show_remote(self, where: str) -> None:
        self.remote_where = where
        self.vram_plot.setVisible(not where and not self.is_cpu_mode)
        for plot in (self.rss_plot, self.cpu_plot):
            plot.setVisible(not where and self.is_cpu_mode)
        self.ttft_plot.setVisible(bool(where))

    def _set_vram_empty(self, text: str) -> None:
        self.vram_note.setText(text)
        self.vram_note.setVisible(bool(text))

    def _now(self) -> float:
        return time.monotonic() - self._t0


def _append(buffer: RingBuffer, t: float, *values: float) -> None:
    """Append a sample; after a pause, a gap first (nan), so the line breaks across it."""
    if buffer.size and t - buffer.last_time() > MAX_GAP_S:
        buffer.append(t - MAX_GAP_S / 2, *([math.nan] * len(values)))
    buffer.append(t, *values)
