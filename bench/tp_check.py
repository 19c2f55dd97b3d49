"""On two GPUs: tensor-parallel decode (tp=2) against the one-GPU fast path, random weights.

Teacher-forced first: both get the same prompt and then the same tokens at the same positions;
per step, the logits' relative error and argmax agreement where the one-GPU top-2 margin exceeds
bf16 rounding (graph_check.Tally); beside it the same against transformers' own modules on one
GPU, a yardstick for what bf16 rounding moves on a random-weight model ("within_yardstick";
--dtype fp32 checks the cut's math exactly). Then tokens/s of each, decoding greedily with a host
sync per token as a session does. With --no-reference (a model over one card's --memory-limit,
e.g. the Qwen2.5-14B shape under 24 GiB) the weights are built on the host and only tp runs;
NVML's peak per GPU (sampled every 50 ms from the start of the ranks to the end) is reported
beside the planner's prediction (plan_multi), whose safety margin is an allowance, not an
allocation: the error is taken against the prediction less its margin. Set
CUDA_DEVICE_ORDER=PCI_BUS_ID so NVML's and CUDA's indices agree.
Usage: python bench/tp_check.py SHAPE_DIR [--tp 2] [--steps 256] [--new-tokens 256]
       [--memory-limit GIB] [--no-reference] [--compile] [--dtype fp32] [--json OUT]
"""

from __future__ import annotations

import argparse
import faulthandler
import json
import os
import signal
import sys
import threading
import time
from pathlib import Path

import torch

sys.path[:0] = [str(Path(__file__).resolve().parents[1]), str(Path(__file__).resolve().parent)]

from graph_check import BF16_ROUNDING, Tally, new_cache  # noqa: E402

from engine.events import LoadRequest  # noqa: E402
from engine.formats.model_shape import ModelShape  # noqa: E402
from engine.load import loader  # noqa: E402
from engine.parallel.leader import TPLeader  # noqa: E402
from engine.parallel.session import random_host_model  # noqa: E402
from engine.plan.multi_gpu import plan_multi  # noqa: E402
from engine.platform import gpu  # noqa: E402
from engine.step.decode import Decoder  # noqa: E402
from engine.tools.bench.decode import _folder_for_random  # noqa: E402


class PeakSampler:
    """NVML's memory of each rank's process on its GPU, the largest seen, every 50 ms."""

    def __init__(self, pids: list[tuple[int, int]]):
        self.pids, self.peak = pids, [0] * len(pids)
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while not self.done.wait(0.05):
            for i, (rank, pid) in enumerate(self.pids):
                self.peak[i] = max(self.peak[i], gpu.process_used_bytes(pid, rank) or 0)

    def stop(self) -> list[int]:
        self.done.set()
        self.thread.join()
        return self.peak


def say(what: str) -> None:
    print(f"{time.strftime('%H:%M:%S')} tp_check: {what}", file=sys.stderr, flush=True)


def tokens_per_s(dec, logits: torch.Tensor, start: int, n: int) -> float:
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for pos in range(start, start + n):
        tok = logits.argmax().view(1)
        int(tok.item())  # the one host sync a session's step has
        logits = dec.step(tok, pos)
    torch.cuda.synchronize()
    return n / (time.perf_counter() - t0)


@torch.inference_mode()
def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("shape")
    ap.add_argument("--tp", type=int, default=2)
    ap.add_argument("--prompt", type=int, default=64)
    ap.add_argument("--steps", type=int, default=256)
    ap.add_argument("--new-tokens", type=int, default=256)
    ap.add_argument("--memory-limit", type=float)
    ap.add_argument("--no-reference", action="store_true")
    ap.add_argument("--compile", action="store_true")
    ap.add_argument("--dtype", choices=("bf16", "fp32"), default="bf16",
                    help="fp32: the cut's math against the whole model's, rounding aside")
    ap.add_argument("--json")
    a = ap.parse_args()
    faulthandler.register(signal.SIGUSR1, all_threads=True)  # tp.sh asks for stacks on a hang
    context = a.prompt + a.steps + a.new_tokens + 1
    # the reference holds the whole model on GPU 0; without one, the model is in host memory as
    # a session's load leaves it, and GPU 0's process holds only rank 0's cut
    req = LoadRequest(model=a.shape, quant=a.dtype, device="cuda", context=context)
    folder = _folder_for_random(a.shape)
    lm = (random_host_model(folder, req, torch.device("cuda", 0)) if a.no_reference
          else loader.random_model(folder, req))
    ids = torch.randint(3, lm.model.config.vocab_size - 1, (a.prompt + a.steps,),
                        generator=torch.Generator().manual_seed(1)).cuda()
    say("model built")
    ref = modules = None
    if not a.no_reference:
        ref = Decoder(lm.model, new_cache(lm, context), lm.device)
        ref.setup_fast_path(allow_graph=True, compile_layers=a.compile)
        # the yardstick: transformers' own modules, another correct implementation on one GPU,
        # against the same fast path; how far two such differ is what bf16 rounding does here
        modules = Decoder(lm.model, new_cache(lm, context), lm.device)
    say("reference ready")
    t0 = time.perf_counter()
    tp = TPLeader(lm.model, a.tp, context, a.dtype, "cuda", a.memory_limit)
    # from here (weights in place; the transfer's transient is rank 0's one tensor at a time)
    sampler = PeakSampler([(0, os.getpid()), *tp.follower_pids.items()]) if not ref else None
    say("ranks started")
    tp.setup_fast_path(allow_graph=True, compile_layers=a.compile)
    say(f"set up: {tp.mode}")
    bound = BF16_ROUNDING if a.dtype == "bf16" else 1e-4
    result = dict(shape=a.shape, tp=a.tp, dtype=a.dtype, bound=bound, tp_mode=tp.mode,
                  tp_notes=tp.notes, tp_start_s=round(time.perf_counter() - t0, 1))
    try:
        tally, yardstick = Tally(), Tally()
        lg_tp = tp.forward(ids[: a.prompt], 0)
        lg_ref = ref.forward(ids[: a.prompt], 0) if ref else None
        if modules:
            modules.forward(ids[: a.prompt], 0)
        for pos in range(a.prompt, a.prompt + a.steps):
            tok = ids[pos: pos + 1]
            lg_tp = tp.step(tok, pos).float().clone()
            if ref:
                lg_ref = ref.step(tok, pos).float().clone()
                tally.add(lg_tp, lg_ref)
                yardstick.add(modules.step(tok, pos).float(), lg_ref)
        say("teacher-forced steps done")
        start = a.prompt + a.steps
        result["tp_tokens_per_s"] = round(tokens_per_s(tp, lg_tp, start, a.new_tokens), 1)
        if ref:
            result["one_gpu_tokens_per_s"] = round(
                tokens_per_s(ref, lg_ref, start, a.new_tokens), 1)
            result["speedup"] = round(result["tp_tokens_per_s"] / result["one_gpu_tokens_per_s"], 2)
            result["vs_one_gpu"] = tally.summary()
            result["agrees"] = tally.ok(bound)
            result["yardstick_modules_vs_one_gpu"] = y = yardstick.summary()
            # within bf16 rounding, judged against the yardstick of the same run: no further
            # from the fast path than transformers' modules are (the fp32 run is the exact check)
            t = result["vs_one_gpu"]
            result["within_yardstick"] = (
                t["median_rel_error"] <= y["median_rel_error"]
                and t["argmax_decisive_steps"] - t["argmax_agree"]
                <= y["argmax_decisive_steps"] - y["argmax_agree"])
        if sampler is not None:  # else GPU 0 also holds the whole model for the reference
            peaks = sampler.stop()
            vram = int(a.memory_limit * 2**30) if a.memory_limit else None
            plan = plan_multi(ModelShape.from_config(lm.folder.config), a.tp, a.dtype, a.dtype,
                              context, vram)
            used = plan.total_bytes_per_device - plan.margin_bytes
            result.update(
                nvml_peak_bytes_per_gpu=peaks, predicted_bytes_per_gpu=plan.total_bytes_per_device,
                predicted_margin_bytes=plan.margin_bytes, predicted_used_bytes_per_gpu=used,
                plan_error_per_gpu=[round(used / p - 1, 4) if p else None for p in peaks],
                plan_within_7_percent=all(bool(p) and abs(used / p - 1) <= 0.07 for p in peaks))
        print(json.dumps(result))  # before close(): its teardown is the last thing to go wrong
        if a.json:
            Path(a.json).write_text(json.dumps(result, indent=1))
    finally:
        say("closing")
        tp.close()
        say("closed")
    return 0 if result.get("agrees", True) else 1


if __name__ == "__main__":
    sys.exit(main())
