"""One chat on the GPU, two ways through the batch loop (generate/batch_run.py, where every
generation runs): does one row need the Decoder's own step?

  solo:    one row's step is the Decoder's own (its graphs per KV bucket): what runs today
  runner:  one row through the batched step (BatchedDecoder, its 1-row graphs)

(Measured at b65f5b9 with a third way, the single-sequence loop that has since gone: see the
benchmark log.) The same greedy request (random weights, ignore_eos) runs in each mode in turn,
`--repeats` times, in one process; each line of the output is one run (decode tokens/s after
the first token, and the first token's latency). The tokens of every mode are checked equal to
the first.

    python3 bench/one_row.py --model bench/qwen2.5-7b [--quant bf16] [--prompt-len 512] \
        [--new-tokens 256] [--repeats 3] [--out one_row.jsonl]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from bench_session import load_random  # noqa: E402  (beside this script)

from engine.events import Finished, GenerateRequest, SamplingParams, Token  # noqa: E402
from engine.generate.batch_run import BatchRun  # noqa: E402
from engine.tools.bench.decode import _prompts  # noqa: E402


def _request(ids: list[int], new_tokens: int) -> GenerateRequest:
    return GenerateRequest(prompt_ids=tuple(ids), max_new_tokens=new_tokens, ignore_eos=True,
                           sampling=SamplingParams(temperature=0.0))


class _Clock:
    """A sink: the time of each token and the tokens themselves."""

    def __init__(self):
        self.times: list[float] = []
        self.ids: list[int] = []
        self.done = False

    def __call__(self, event) -> None:
        if isinstance(event, Token):
            self.times.extend([time.perf_counter()] * len(event.token_ids))
            self.ids.extend(event.token_ids)
        elif isinstance(event, Finished):
            self.done = True


def _one(mode: str, session, run: BatchRun, ids: list[int], new_tokens: int) -> dict:
    session.cache.clear()
    clock = _Clock()
    t0 = time.perf_counter()
    run.batched.solo = mode == "solo"
    run.add(_request(ids, new_tokens), clock)
    while run.has_work:
        run.step()
    n = len(clock.times)
    decode = (n - 1) / (clock.times[-1] - clock.times[0]) if n > 1 else None
    return {"mode": mode, "tokens": n, "decode_tokens_per_s": decode,
            "ttft_ms": (clock.times[0] - t0) * 1000, "ids": clock.ids}


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--model", required=True)
    p.add_argument("--quant", default="bf16")
    p.add_argument("--prompt-len", type=int, default=512)
    p.add_argument("--new-tokens", type=int, default=256)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--out", default=None)
    a = p.parse_args()
    session = load_random(a.model, a.quant, a.prompt_len, a.new_tokens)
    ids = _prompts(1, a.prompt_len, session.lm.model.config.vocab_size, seed=0)[0]
    run = BatchRun(session, max_seqs=1)
    modes = ("solo", "runner")
    for mode in modes:  # warm-up: graphs captured, kernels compiled
        _one(mode, session, run, ids, min(a.new_tokens, 16))
    rows, first = [], None
    for r in range(a.repeats):
        for mode in modes:
            row = _one(mode, session, run, ids, a.new_tokens)
            first = first or row["ids"]
            row["same_tokens_as_first"] = row.pop("ids") == first
            row["repeat"] = r
            rows.append(row)
            print(json.dumps(row), flush=True)
    for mode in modes:
        rates = [x["decode_tokens_per_s"] for x in rows if x["mode"] == mode]
        print(f"{mode}: median decode {statistics.median(rates):.1f} tokens/s over {len(rates)}")
    if a.out:
        Path(a.out).write_text("".join(json.dumps(x) + "\n" for x in rows))


if __name__ == "__main__":
    main()
