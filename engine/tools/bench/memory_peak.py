"""The memory figures of `hearth bench --concurrency` (the memory targets): NVML's peak for
this process while the rounds run (a thread polls it every few milliseconds), torch's peak
reserved bytes, and the planner's prediction for the load as it was made: the model's shape and
format, its context, the arena the engine actually sized for the sequences it was asked to hold
at once (on a capped card: the sequences of `context` tokens that fit), without the planner's
safety margin, as plan_check.py compares them for a single sequence.
"""

from __future__ import annotations

import threading
import time

import torch

from engine.platform.telemetry import nvml_process_used_bytes

POLL_S = 0.005


class PeakSampler:
    """NVML's per-process used bytes on `device`, sampled until stop(); peak in `peak`."""

    def __init__(self, device: torch.device):
        self.device, self.peak = device, None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="hearth-bench-nvml", daemon=True)

    def __enter__(self) -> PeakSampler:
        if self.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(self.device)
            self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()

    def _run(self) -> None:
        while not self._stop.is_set():
            used = nvml_process_used_bytes(self.device)
            if used is not None:
                self.peak = max(self.peak or 0, used)
            time.sleep(POLL_S)


def figures(session, sampler: PeakSampler, concurrency: int) -> dict:
    """The prediction beside what was measured; on a CPU, why there is none."""
    lm = session.lm
    if lm.device.type != "cuda":
        return {"unavailable": "NVML measures GPU memory; this ran on the CPU"}
    from engine.formats.model_shape import ModelShape
    from engine.plan.memory import plan

    cache = session.cache
    per_seq = -(-lm.context // cache.block_size)  # blocks a whole context takes
    seqs = max(1, min(concurrency, len(cache.blocks.blocks) // per_seq))
    budget = session.config.allocator_budget_bytes
    shape = ModelShape.from_config(lm.folder.config)
    p = plan(shape, lm.quant, session.kv_dtype, lm.context, budget,
             prefill_chunk=session.prefill_chunk, concurrency=seqs)
    predicted = p.total_bytes - p.margin_bytes
    out = {"predicted_bytes": predicted, "planned_sequences": seqs,
           "arena_blocks": len(cache.blocks.blocks), "arena_bytes": cache.num_bytes,
           "planned_kv_bytes": p.kv_bytes, "budget_bytes": budget,
           "torch_peak_reserved_bytes": torch.cuda.max_memory_reserved(lm.device),
           "nvml_peak_bytes": sampler.peak}
    if sampler.peak:
        out["predicted_over_nvml_peak"] = round(predicted / sampler.peak, 4)
    return out
