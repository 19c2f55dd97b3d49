"""The switch-off on a model of measured GPU costs: the engine's own Controller, driven by rounds
whose times come from the 7B/0.5B measurements (a plain step T, a draft step C * T, a verify
pass of n tokens (1 + 0.026 n) T: about 2.1 T a round at K = 4, as measured) and acceptance
drawn per proposal. A tuning aid, not a measurement: what it prints goes nowhere but here.

    python bench/switch_off_sim.py   # three 128-token answers per controller, as
                                               # `hearth bench --synthetic-acceptance` runs them
"""

import random
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from engine.spec.controller import Controller  # noqa: E402

T = 0.0048  # seconds a plain 7B step (bf16, CUDA graph)
C = 0.2425  # the draft's step over the target's, measured by the bench


def verify_s(n: int) -> float:
    return (1.0 + 0.026 * n) * T


def generation(ctrl: Controller, alpha: float, rng: random.Random, entry: float,
               new: int = 128) -> float:
    """One answer, as a speculating row runs it (its controller's rounds and plain steps) -> its
    speed over plain decoding."""
    t, made, started = 0.0, 1, False  # the first token comes from the prefill
    resting = False  # plain steps since the last round: the next round's draft catches up

    def noise() -> float:
        return rng.lognormvariate(0, 0.03)

    while made < new:
        k = ctrl.next_k(new - made - 1)
        if k and not started:  # the draft's prompt prefill
            t += entry
            ctrl.overhead(entry)
            started = True
        if k == 0:
            s = T * noise()
            t += s
            ctrl.plain_done(s)
            made += 1
            resting = started
            continue
        accepted = 0
        while accepted < k and rng.random() < alpha:
            accepted += 1
        d, v = k * C * T * noise(), verify_s(k + 1) * noise()
        if resting:  # one pass over the plain stretch: about as dear as the prompt's
            d += entry
            resting = False
        t += d + v
        ctrl.round_done(k, accepted, d, v, d + v)
        made += accepted + 1
    return (new - 1) * T / t


def run(alpha: float, entry: float, switch_off: bool, seeds: int = 300) -> list[float]:
    """-> the median of three answers' speedups, for each seed, sorted."""
    medians = []
    for seed in range(seeds):
        rng = random.Random(seed)
        ctrl = Controller(max_k=4, adaptive=False, switch_off=switch_off,
                          plain_step_s=None if switch_off else T)
        if switch_off:
            ctrl.plain_done(0.5)  # the first step's one-time costs
        speeds = []
        for _ in range(3):
            speeds.append(generation(ctrl, alpha, rng, entry))
            ctrl.new_generation()
        medians.append(statistics.median(speeds))
    return sorted(medians)


if __name__ == "__main__":
    # the draft's prefill of a 512-token prompt, in plain steps: 2.5-3.5 measured on a GPU
    # (2026-12-01), 10 once (a prompt and a plain stretch of 100 tokens)
    for steps in (3.0, 10.0):
        print(f"draft prefill {steps} plain steps")
        for alpha in (0.0, 0.3, 0.4, 0.5, 0.55, 0.6, 0.7, 0.8, 0.9):
            alone = statistics.mean(run(alpha, steps * T, switch_off=False, seeds=100))
            m = run(alpha, steps * T, switch_off=True)
            print(f"  alpha {alpha}: speculation alone {alone:.3f}x, with the switch-off "
                  f"{statistics.mean(m):.3f}x (10th percentile {m[len(m) // 10]:.3f}x, "
                  f"below 0.95x: {sum(x < 0.95 for x in m) / len(m):.0%})")
