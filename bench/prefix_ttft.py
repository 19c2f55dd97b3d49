"""On a GPU: the time-to-first-token targets, with random weights at a real shape.

1. Multi-turn: a conversation of `--history` tokens (turn 1: prompt and an 8-token answer), then
   turn 2 adds `--new` tokens. Its TTFT with the cache of turn 1 against the same prompt from an
   empty cache (target: at most 15%).
2. A shared system prompt: conversation A (a `--system`-token system prompt and `--new` tokens)
   runs, then an unrelated conversation C (so A is no longer the live one), then conversation B,
   the same system prompt and other `--new` tokens, whose full blocks the cache finds by hash.
   Its TTFT against B from an empty cache (target: at most 30%).

Each measurement is the median of `--runs` (after one warm-up of each kind); the Stats events'
cached and computed prompt tokens are reported with it, so a miss shows as computed tokens.
Usage (repository root):
    python3 bench/prefix_ttft.py --model bench/qwen2.5-7b [--quant bf16]
        [--history 8000] [--system 4000] [--new 50] [--runs 3] [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from engine.events import (  # noqa: E402
    Failed,
    Finished,
    GenerateRequest,
    LoadRequest,
    SamplingParams,
    Token,
)
from engine.generate.session import Session  # noqa: E402
from engine.load import loader  # noqa: E402
from engine.tools.bench.decode import _folder_for_random  # noqa: E402


def generate(session: Session, ids: list[int], new_tokens: int) -> tuple[Finished, list[int]]:
    """One greedy generation over whatever the cache holds (no clearing)."""
    req = GenerateRequest(prompt_ids=tuple(ids), max_new_tokens=new_tokens, ignore_eos=True,
                          sampling=SamplingParams(temperature=0.0))
    events = list(session.generate(req))
    if isinstance(events[-1], Failed):
        raise RuntimeError(events[-1].error)
    return events[-1], [i for e in events if isinstance(e, Token) for i in e.token_ids]


def random_ids(n: int, vocab: int, g: torch.Generator) -> list[int]:
    return torch.randint(3, vocab - 1, (n,), generator=g).tolist()


def stats(f: Finished) -> dict:
    s = f.stats
    return dict(ttft_ms=s.ttft_ms, cached=s.cached_prompt_tokens,
                computed=s.computed_prompt_tokens)


def multi_turn(session: Session, vocab: int, history: int, new: int, seed: int) -> dict:
    g = torch.Generator().manual_seed(seed)
    turn1 = random_ids(history, vocab, g)
    session.cache.clear()
    _, answer = generate(session, turn1, 8)
    turn2 = turn1 + answer + random_ids(new, vocab, g)
    warm = stats(generate(session, turn2, 1)[0])
    session.cache.clear()  # forgets cached prefixes too: a cold start
    cold = stats(generate(session, turn2, 1)[0])
    return dict(prompt_tokens=len(turn2), warm=warm, cold=cold)


def shared_system(session: Session, vocab: int, system: int, new: int, seed: int) -> dict:
    g = torch.Generator().manual_seed(seed)
    sys_ids = random_ids(system, vocab, g)
    a, b = sys_ids + random_ids(new, vocab, g), sys_ids + random_ids(new, vocab, g)
    session.cache.clear()
    generate(session, a, 8)
    generate(session, random_ids(new, vocab, g), 8)  # C: A's blocks stay cached, not live
    warm = stats(generate(session, b, 1)[0])  # another conversation: found by hash
    session.cache.clear()
    cold = stats(generate(session, b, 1)[0])
    return dict(prompt_tokens=len(b), warm=warm, cold=cold)


def summarize(name: str, runs: list[dict], target: float) -> dict:
    warm = statistics.median(r["warm"]["ttft_ms"] for r in runs)
    cold = statistics.median(r["cold"]["ttft_ms"] for r in runs)
    return dict(check=name, prompt_tokens=runs[0]["prompt_tokens"], warm_ttft_ms=round(warm, 2),
                cold_ttft_ms=round(cold, 2), ratio=round(warm / cold, 4), target=target,
                met=warm / cold <= target, runs=runs)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", required=True, help="a folder with config.json (random weights)")
    p.add_argument("--quant", default="bf16")
    p.add_argument("--history", type=int, default=8000)
    p.add_argument("--system", type=int, default=4000)
    p.add_argument("--new", type=int, default=50)
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--json", metavar="FILE")
    a = p.parse_args(argv)
    context = max(a.history + 8, a.system) + a.new + 64
    req = LoadRequest(model=a.model, quant=a.quant, device="auto", context=context)
    session = Session(loader.random_model(_folder_for_random(a.model), req), "auto")
    vocab = session.lm.model.config.vocab_size
    multi_turn(session, vocab, a.history, a.new, seed=99)  # warm-up: graphs, kernels, allocator
    shared_system(session, vocab, a.system, a.new, seed=99)
    rows = [summarize("second turn after the history", [
                multi_turn(session, vocab, a.history, a.new, seed=i) for i in range(a.runs)], 0.15),
            summarize("new conversation, system prompt seen before", [
                shared_system(session, vocab, a.system, a.new, seed=i) for i in range(a.runs)],
                0.30)]
    device = torch.cuda.get_device_name() if session.lm.device.type == "cuda" else "cpu"
    print(f"{a.model}, {session.lm.quant} weights (random), {device}; {a.new} new tokens; "
          f"TTFT median of {a.runs}\n")
    print("| check | prompt tokens | TTFT with reuse ms (cached / computed) | TTFT cold ms | "
          "ratio | target |")
    print("|---|---|---|---|---|---|")
    for r in rows:
        w = r["runs"][0]["warm"]
        print(f"| {r['check']} | {r['prompt_tokens']:,} | {r['warm_ttft_ms']:.1f} "
              f"({w['cached']:,} / {w['computed']:,}) | {r['cold_ttft_ms']:.1f} | "
              f"{r['ratio']:.3f} | {r['target']:.2f} ({'met' if r['met'] else 'missed'}) |")
    if a.json:
        Path(a.json).write_text("".join(json.dumps(r) + "\n" for r in rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
