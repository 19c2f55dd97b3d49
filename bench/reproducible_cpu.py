"""CPU: what the reproducible mode costs on a real model. One process, two sessions of
the same model (--reproducible off and on), each prompt length answered 3 times by each in
turn from a cold cache: TTFT and decode tokens/s, medians. Usage (repo root):
    python bench/reproducible_cpu.py MODEL_FOLDER 32,128,512"""

from __future__ import annotations

import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import engine  # noqa: E402,F401  (the thread policy, before torch)
from engine.events import Finished, GenerateRequest, LoadRequest, SamplingParams  # noqa: E402
from engine.generate.session import Session  # noqa: E402

WORDS = ("the quick brown fox jumps over a lazy dog while seven wizards quietly judge boxing "
         "matches in a small town by the river ").split() * 40


def main(model: str, lengths: str) -> None:
    sessions = {m: Session.load(LoadRequest(model=model, device="cpu", reproducible=m == "on"))
                for m in ("off", "on")}
    print("| prompt tokens | mode | TTFT ms (3 runs) | median | decode tok/s (3 runs) | median |")
    print("|---|---|---|---|---|---|")
    for n in (int(x) for x in lengths.split(",")):
        runs = {m: [] for m in sessions}
        for _ in range(3):
            for m, s in sessions.items():
                s.cache.clear()
                req = GenerateRequest(prompt=" ".join(WORDS[:n]), raw=True, max_new_tokens=64,
                                      ignore_eos=True, sampling=SamplingParams(temperature=0.0))
                end = [e for e in s.generate(req) if isinstance(e, Finished)][0].stats
                runs[m].append((end.ttft_ms, end.decode_tokens_per_s, end.prompt_tokens))
        for m, r in runs.items():
            ttft, dec = [x[0] for x in r], [x[1] for x in r]
            print(f"| {r[0][2]} | {m} | {' '.join(map(str, ttft))} | {statistics.median(ttft)} "
                  f"| {' '.join(map(str, dec))} | {statistics.median(dec)} |", flush=True)


if __name__ == "__main__":
    main(*sys.argv[1:3])
