"""Where a short prompt's time to first token goes (AWQ's 512-token TTFT measured
about 2x bf16's while its GPU work is about 15 ms): for each quantization, the engine's round
TTFT, then the decoder's own prefill (Decoder.forward) timed three ways: wall clock with a
synchronize, the GPU's time between two events, and the kernels' summed time under
torch.profiler; then cProfile over a few prefills (the host's calls by own time).

    python3 bench/prefill_host.py --model bench/qwen2.5-7b --quant awq bf16
"""

from __future__ import annotations

import argparse
import cProfile
import gc
import io
import pstats
import statistics
import sys
import time
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, str(Path(__file__).parent))
from bench_session import load_random, running  # noqa: E402  (beside this script)

from engine.events import GenerateRequest, SamplingParams, Token  # noqa: E402
from engine.tools.bench.concurrent import run_round  # noqa: E402
from engine.tools.bench.decode import _prompts  # noqa: E402


def _engine_ttft(session, prompt_len: int, vocab: int) -> list[float]:
    with running(session) as engine:
        run_round(engine, _prompts(1, prompt_len, vocab, seed=1), 4)  # warm-up
        return [run_round(engine, _prompts(1, prompt_len, vocab, seed=s), 8).ttft_ms_p50
                for s in (2, 3, 4)]


def _forward_times(decoder, ids: torch.Tensor) -> tuple[list[float], list[float]]:
    wall, gpu = [], []
    for _ in range(5):
        torch.cuda.synchronize()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        t0 = time.perf_counter()
        start.record()
        decoder.forward(ids, 0)
        end.record()
        t_host = time.perf_counter()
        torch.cuda.synchronize()
        wall.append((time.perf_counter() - t0) * 1e3)
        gpu.append(start.elapsed_time(end))
        print(f"  host returned after {(t_host - t0) * 1e3:.2f} ms", flush=True)
    return wall, gpu


def _generate_phases(session, prompt: list[int], sync: bool) -> dict[str, float]:
    """One request through Session.generate in this thread: ms from the call to the prefill's
    start, the prefill (with a synchronize at its end when `sync`), and from there to the
    first token event."""
    marks = {}
    forward = session.decoder.forward

    def timed(ids, start):
        marks.setdefault("in", time.perf_counter())
        out = forward(ids, start)
        if sync:
            torch.cuda.synchronize()
        marks["out"] = time.perf_counter()
        return out

    session.decoder.forward = timed
    try:
        req = GenerateRequest(prompt_ids=tuple(prompt), max_new_tokens=2, ignore_eos=True,
                              sampling=SamplingParams(temperature=0.0))
        t0 = time.perf_counter()
        for event in session.generate(req):
            if isinstance(event, Token):
                marks["token"] = time.perf_counter()
                break
    finally:
        session.decoder.forward = forward
    return {"to_prefill": round((marks["in"] - t0) * 1e3, 2),
            "prefill": round((marks["out"] - marks["in"]) * 1e3, 2),
            "to_token": round((marks["token"] - marks["out"]) * 1e3, 2),
            "ttft": round((marks["token"] - t0) * 1e3, 2)}


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--model", required=True)
    p.add_argument("--quant", nargs="+", default=["awq", "bf16"])
    p.add_argument("--prompt-len", type=int, default=512)
    a = p.parse_args()
    for quant in a.quant:
        session = load_random(a.model, quant, a.prompt_len, 16)
        vocab = session.lm.model.config.vocab_size
        print(f"== {quant}: engine round TTFT ms", _engine_ttft(session, a.prompt_len, vocab),
              flush=True)
        ids = torch.tensor(_prompts(1, a.prompt_len, vocab, seed=9)[0],
                           device=session.lm.device)
        for sync in (False, True, False, True):
            for seed in (11, 12):
                prompt = _prompts(1, a.prompt_len, vocab, seed=seed + 10 * sync)[0]
                print(f"== {quant}: generate phases ms (sync {sync})",
                      _generate_phases(session, prompt, sync), flush=True)
        wall, gpu = _forward_times(session.decoder, ids)
        print(f"== {quant}: Decoder.forward wall ms {[round(w, 2) for w in wall]} "
              f"(median {statistics.median(wall):.2f}); GPU between events "
              f"{[round(g, 2) for g in gpu]} (median {statistics.median(gpu):.2f})", flush=True)
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            session.decoder.forward(ids, 0)
            torch.cuda.synchronize()
        kernels = [e for e in prof.key_averages() if e.device_type.name == "CUDA"]
        busy = sum(e.self_device_time_total for e in kernels) / 1e3
        print(f"== {quant}: kernels' summed time under the profiler {busy:.2f} ms", flush=True)
        print(prof.key_averages().table(sort_by="self_cuda_time_total", row_limit=12,
                                        max_name_column_width=60))
        prof_c = cProfile.Profile()
        prof_c.enable()
        for _ in range(3):
            session.decoder.forward(ids, 0)
        torch.cuda.synchronize()
        prof_c.disable()
        s = io.StringIO()
        pstats.Stats(prof_c, stream=s).sort_stats("tottime").print_stats(25)
        print(f"== {quant}: cProfile of 3 prefills, by own time\n{s.getvalue()}", flush=True)
        del session, ids, prof
        gc.collect()
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
