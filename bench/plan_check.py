"""On a GPU: the VRAM planner against real memory, emulating consumer cards.

For each model shape (random weights) and card size, a child process caps torch's allocator at the
card minus the measured CUDA context (`--memory-limit`), loads the planner's recommended format at
its longest planned context, prefills a prompt that fills that context and decodes to its end,
while a thread polls NVML's per-process used memory every 2 ms. Reported: the planner's predicted
peak (its total without the safety margin), the measured peak, their ratio, and the peak as a
fraction of the card. Children run a few at a time on one GPU: NVML counts each process apart.

The KV cache is planned in 16 bits (`kv_dtype="bf16"`), and for one row in int8 (how
much longer a context a 12 GiB card holds with it).
One more child checks the out-of-memory path: the 7B shape forced to bf16 on an 8 GiB card must
fail with the planner's hint, then the recommended load in the same process must generate.

The children run with the allocator settings the engine sets for itself (engine/__init__.py:
expandable segments); `--no-expandable` turns them off for comparison.

Usage: python bench/plan_check.py [--out DIR] [--no-expandable]
       (children: --one SHAPE GIB KV | --oom)
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
import engine  # noqa: E402, F401 (its allocator settings, before anything imports torch)

SHAPES = ("qwen2.5-0.5b", "qwen2.5-7b", "llama-3.1-8b")
CARDS_GIB = (8, 12, 16, 24)
NEW_TOKENS = 16
# children run together where their caps fit a 140 GiB GPU: 8B + 0.5B + the OOM, then 7B
# and the quantized cache's check: the longest context under a 12 GiB cap with an int8 KV cache
# (the bf16 one is the 12 GiB row of the first wave; NF4 weights, which the planner picks there)
WAVES = ([(m, c, "bf16") for m in ("llama-3.1-8b", "qwen2.5-0.5b") for c in CARDS_GIB],
         [("qwen2.5-7b", c, "bf16") for c in CARDS_GIB]
         + [("llama-3.1-8b", 12, "int8")])
# the device tool's call limit is 600 s: stop the stragglers before it (or before PLAN_DEADLINE_S)
DEADLINE_S = float(os.environ.get("PLAN_DEADLINE_S", 560))


class PeakPoller:
    """NVML's used memory of this process, polled on a thread: the peak over a run."""

    def __init__(self, index: int = 0, period_s: float = 0.002):
        import pynvml

        self.nvml, self.period = pynvml, period_s
        pynvml.nvmlInit()
        self.handle = pynvml.nvmlDeviceGetHandleByIndex(index)
        self.peak, self.stop = 0, threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def read(self) -> int:
        for p in self.nvml.nvmlDeviceGetComputeRunningProcesses(self.handle):
            if p.pid == os.getpid():
                return int(p.usedGpuMemory or 0)
        return 0

    def _run(self) -> None:
        while not self.stop.is_set():
            self.peak = max(self.peak, self.read())
            time.sleep(self.period)

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.stop.set()
        self.thread.join()
        self.peak = max(self.peak, self.read())


def _recommendation(shape_dir: Path, gib: float, cc, kv_dtype: str):
    from engine.formats.model_shape import ModelShape
    from engine.plan.memory import GiB, recommend

    shape = ModelShape.from_folder(shape_dir)
    return shape, recommend(shape, int(gib * GiB), cc, kv_dtype=kv_dtype)


def _load(shape_dir: Path, quant: str, context: int, gib: float, kv_dtype: str = "bf16"):
    from engine.events import LoadRequest
    from engine.generate.session import Session
    from engine.load import loader
    from engine.tools.bench.decode import _folder_for_random

    req = LoadRequest(model=str(shape_dir), quant=quant, kv_dtype=kv_dtype, context=context,
                      memory_limit_gib=gib)
    lm = loader.random_model(_folder_for_random(str(shape_dir)), req)
    return Session(lm, kv_dtype)


def _generate(session, prompt_len: int):
    import torch

    from engine.events import GenerateRequest, SamplingParams

    ids = torch.randint(3, 30000, (prompt_len,), generator=torch.Generator().manual_seed(0))
    req = GenerateRequest(prompt_ids=tuple(ids.tolist()), max_new_tokens=NEW_TOKENS,
                          ignore_eos=True, sampling=SamplingParams(temperature=0.0))
    return list(session.generate(req))[-1]


def one(name: str, gib: float, kv_dtype: str = "bf16") -> dict:
    import torch

    from engine.plan.memory import plan

    props = torch.cuda.get_device_properties(0)
    cc = (props.major, props.minor)
    shape_dir = ROOT / "bench" / name
    shape, rec = _recommendation(shape_dir, gib, cc, kv_dtype)
    row = dict(model=name, card_gib=gib, quant=rec.quant, kv_dtype=rec.kv_dtype,
               context=rec.context, native_context=shape.context_limit, fits=rec.fits)
    if not rec.fits:
        row["note"] = rec.note
        return row
    with PeakPoller() as poll:
        t0 = time.perf_counter()
        session = _load(shape_dir, rec.quant, rec.context, gib, rec.kv_dtype)
        row["load_s"] = round(time.perf_counter() - t0, 1)
        row["load_peak"] = poll.peak
        t0 = time.perf_counter()
        end = _generate(session, rec.context - NEW_TOKENS)
        row["generate_s"] = round(time.perf_counter() - t0, 1)
    p = plan(shape, rec.quant, rec.kv_dtype, rec.context, int(gib * 2**30),
             prefill_chunk=session.prefill_chunk, compute_capability=cc)
    predicted = p.total_bytes - p.margin_bytes
    row.update(result=type(end).__name__, error=getattr(end, "error", None),
               decode_path=session.decoder.mode, prefill_chunk=session.prefill_chunk,
               predicted=predicted, measured=poll.peak,
               measured_over_predicted=round(poll.peak / predicted, 4),
               measured_over_card=round(poll.peak / (gib * 2**30), 4),
               torch_max_reserved=int(torch.cuda.max_memory_reserved()),
               torch_max_allocated=int(torch.cuda.max_memory_allocated()),
               kv_dtype_loaded=session.cache.kv_dtype,
               alloc_conf=os.environ.get("PYTORCH_CUDA_ALLOC_CONF", ""),
               parts={k: getattr(p, k) for k in (
                   "weights_bytes", "kv_bytes", "activation_bytes", "cuda_context_bytes",
                   "graph_pool_bytes", "margin_bytes")},
               weights_measured=sum(t.numel() * t.element_size() for t in
                                    list(session.lm.model.parameters())
                                    + list(session.lm.model.buffers())),
               kv_measured=session.cache.num_bytes)
    return row


def oom_then_recover() -> dict:
    """bf16 7B on an 8 GiB card: the load must fail with a hint; the hint's load must work."""
    from engine.plan.oom import OutOfMemory, out_of_memory

    shape_dir = ROOT / "bench/qwen2.5-7b"
    row, oom = dict(check="7B bf16 forced on an 8 GiB card, then the recommended load"), False
    try:
        _load(shape_dir, "bf16", 4096, 8)
        row["first"] = "loaded (expected out of memory)"
    except Exception as e:  # random_model is below Session.load: translate as it does
        import torch

        if not isinstance(e, torch.OutOfMemoryError | OutOfMemory):
            row["first"] = f"{type(e).__name__}: {e}"
            return row
        oom = True
    if oom:
        cfg = json.loads((shape_dir / "config.json").read_text())
        err = out_of_memory("the model does not fit in this GPU's memory", cfg, "bf16", 4096,
                            8 << 30)
        row.update(first="out of memory", message=str(err), hint=err.hint)
        import torch

        row["reserved_after_release"] = int(torch.cuda.memory_reserved())
        session = _load(shape_dir, "nf4", 4096, 8)
        end = _generate(session, 512)
        row["then"] = f"nf4 at 4096: {type(end).__name__}"
    return row


START = time.monotonic()
EXPANDABLE = True


def parent(out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    rows = []
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    if not EXPANDABLE:  # the engine's default lets empty_cache return the holes that fusing
        env["PYTORCH_CUDA_ALLOC_CONF"] = "expandable_segments:False"  # q/k/v and gate/up leave
    waves = [list(w) for w in WAVES]
    waves[0].append(("--oom", None, None))
    for wave in waves:
        procs = []
        for name, gib, kv in wave:
            args = ["--oom"] if name == "--oom" else ["--one", name, str(gib), kv]
            procs.append(subprocess.Popen([sys.executable, __file__, *args],
                                          stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                          text=True, env=env))
        for (name, gib, _), proc in zip(wave, procs, strict=True):
            try:
                stdout, stderr = proc.communicate(timeout=max(1, DEADLINE_S - (
                    time.monotonic() - START)))
            except subprocess.TimeoutExpired:
                proc.kill()
                stdout, stderr = proc.communicate()
                stderr += "\n(killed at the deadline)"
            lines = [ln for ln in stdout.splitlines() if ln.startswith("{")]
            row = json.loads(lines[-1]) if lines else dict(
                model=name, card_gib=gib, crashed=proc.returncode, stderr=stderr[-800:])
            rows.append(row)
            print(json.dumps(row), flush=True)
    (out / "plan_check.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    print(table(rows))
    (out / "plan_check.md").write_text(table(rows))


def table(rows: list[dict]) -> str:
    gib = 2**30
    lines = ["| model | card | weights | KV | context (native) | prefill chunk | predicted peak | "
             "measured peak (NVML) | measured / predicted | measured / card | result |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        if "model" not in r or "measured" not in r:
            continue
        lines.append(
            f"| {r['model']} | {r['card_gib']} GiB | {r['quant']} | {r['kv_dtype']} | "
            f"{r['context']:,} ({r['native_context']:,}) | {r['prefill_chunk']} | "
            f"{r['predicted'] / gib:.2f} GiB | {r['measured'] / gib:.2f} GiB | "
            f"{r['measured_over_predicted']:.3f} | {r['measured_over_card']:.3f} | "
            f"{r['result']} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--one", nargs=3, metavar=("SHAPE", "GIB", "KV"))
    ap.add_argument("--oom", action="store_true")
    ap.add_argument("--out", default=os.environ.get("OUT", "/tmp/out"))
    ap.add_argument("--no-expandable", action="store_true",
                    help="children run with PYTORCH_CUDA_ALLOC_CONF=expandable_segments:False")
    a = ap.parse_args()
    global EXPANDABLE
    EXPANDABLE = not a.no_expandable
    if a.one:
        try:
            row = one(a.one[0], float(a.one[1]), a.one[2])
        except Exception as e:  # one line back to the parent, whatever broke
            row = dict(model=a.one[0], card_gib=float(a.one[1]),
                       failed=f"{type(e).__name__}: {str(e)[:500]}")
        print(json.dumps(row), flush=True)
    elif a.oom:
        print(json.dumps(oom_then_recover()), flush=True)
    else:
        parent(Path(a.out))


if __name__ == "__main__":
    main()
