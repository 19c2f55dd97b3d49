"""What the switch-off saw and decided on a GPU: `hearth bench --synthetic-acceptance A` run
in-process (engine.cli.cli.main) with the engine's Controller wrapped to record every plain step,
round, start of speculation (its cost) and judgement, as JSON lines. For the switch-off's
tuning (switch_off_sim.py models these costs); it measures nothing the bench does not.

    python3 bench/switch_off_trace.py --out trace.jsonl --alphas 0.3 0.5 0.7 \
        -- --model bench/qwen2.5-7b --random-weights --quant bf16 \
           --draft bench/qwen2.5-0.5b --new-tokens 128 --num-speculative-tokens 4
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from engine.cli import cli  # noqa: E402
from engine.spec import controller as spec_controller

EVENTS: list[dict] = []
LABEL = {"alpha": None}


def _wrap(name: str, record) -> None:
    original = getattr(spec_controller.Controller, name)

    def wrapped(self, *args):
        before = (self.switched_off, self.plain_left)
        out = original(self, *args)
        if self.switch_off:  # the controllers the switch-off figure comes from
            row = record(self, *args)
            row.update(kind=name, ctrl=id(self) % 10007, alpha_set=LABEL["alpha"],
                       plain_left=self.plain_left, off_before=before[0])
            EVENTS.append(row)
        return out

    setattr(spec_controller.Controller, name, wrapped)


def _judged(self) -> dict:
    return dict(alpha=round(self.alpha, 4), judged=round(self.judged_alpha, 4),
                round_s=self.round.value, plain_s=self.plain_step_s, entry_s=self.entry_s,
                backoff=self.backoff, switched_off=self.switched_off)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--out", required=True)
    p.add_argument("--alphas", type=float, nargs="+", default=[0.3, 0.5, 0.7])
    p.add_argument("bench", nargs=argparse.REMAINDER)
    a = p.parse_args()
    args = [x for x in a.bench if x != "--"]
    _wrap("plain_done", lambda self, s: dict(s=s))
    _wrap("round_done", lambda self, prop, acc, d, v, s: dict(prop=prop, acc=acc, draft_s=d,
                                                               verify_s=v, s=s))
    _wrap("overhead", lambda self, s: dict(s=s))
    _wrap("_judge", _judged)
    _wrap("new_generation", lambda self: {})
    for alpha in a.alphas:
        LABEL["alpha"] = alpha
        cli.main(["bench", *args, "--synthetic-acceptance", str(alpha),
                  "--out", f"/tmp/switch_off_{alpha}.json"])
        result = json.load(open(f"/tmp/switch_off_{alpha}.json"))
        EVENTS.append(dict(kind="result", alpha_set=alpha,
                           switch_off_speedup=result["speculative"]["switch_off_speedup"],
                           speedup=result["speculative"]["speedup"]))
    with open(a.out, "w") as f:
        for row in EVENTS:
            f.write(json.dumps(row) + "\n")


if __name__ == "__main__":
    main()
