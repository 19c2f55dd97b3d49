"""The arithmetic of a concurrent benchmark round: from each request's clock readings to the
seed's fields, aggregate decode throughput and latency percentiles. Pure Python, no torch.
"""

from __future__ import annotations

import itertools
import math
import statistics
from dataclasses import dataclass, field, fields


@dataclass
class Timing:
    """One request's clock readings (time.perf_counter seconds)."""

    submit_s: float
    token_s: list[float] = field(default_factory=list)  # one per generated token id
    end_s: float | None = None  # its stream's last event
    reason: str | None = None  # Finished's reason
    error: str | None = None  # Failed's error
    bad_input: bool = False


@dataclass
class Round:
    concurrency: int
    # the seed's benchmark, as it defines them: seconds from the first submit to the last end
    total_time: float
    total_tokens: int
    throughput: float  # total_tokens / total_time
    avg_latency: float  # total_time / len(prompts)
    # generated tokens after each request's first, over first first-token to last token
    aggregate_decode_tokens_per_s: float | None
    ttft_ms_p50: float | None
    ttft_ms_p99: float | None
    itl_ms_p50: float | None  # inter-token latency, the gaps of every request pooled
    itl_ms_p99: float | None
    num_finished: int  # streams that ended in Finished


def percentile(values: list[float], q: float) -> float | None:
    """The q-th percentile (0-100), linear between closest ranks (numpy's default)."""
    if not values:
        return None
    xs = sorted(values)
    pos = (len(xs) - 1) * q / 100
    lo, hi = math.floor(pos), math.ceil(pos)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def aggregate_decode(token_s: list[list[float]]) -> float | None:
    """Decode tokens/s of all requests together: each request's tokens after its first, over
    the time from the earliest first token to the latest token (None: no such tokens)."""
    timed = [ts for ts in token_s if ts]
    decoded = sum(len(ts) - 1 for ts in timed)
    if decoded == 0:
        return None
    span = max(ts[-1] for ts in timed) - min(ts[0] for ts in timed)
    return decoded / span if span > 0 else None


def _ms(x: float | None) -> float | None:
    return None if x is None else x * 1000


def summarize(timings: list[Timing], t_start: float) -> Round:
    """One round's figures; `t_start` is the clock just before the first submit."""
    total_time = max(t.end_s for t in timings) - t_start
    total_tokens = sum(len(t.token_s) for t in timings)
    ttft = [t.token_s[0] - t.submit_s for t in timings if t.token_s]
    gaps = [b - a for t in timings for a, b in itertools.pairwise(t.token_s)]
    return Round(
        concurrency=len(timings), total_time=total_time, total_tokens=total_tokens,
        throughput=total_tokens / total_time, avg_latency=total_time / len(timings),
        aggregate_decode_tokens_per_s=aggregate_decode([t.token_s for t in timings]),
        ttft_ms_p50=_ms(percentile(ttft, 50)), ttft_ms_p99=_ms(percentile(ttft, 99)),
        itl_ms_p50=_ms(percentile(gaps, 50)), itl_ms_p99=_ms(percentile(gaps, 99)),
        num_finished=sum(t.reason is not None for t in timings))


SEED_FIELDS = ("total_time", "total_tokens", "throughput", "avg_latency")


def median_round(rounds: list[Round]) -> Round:
    """The median of each figure over the repeats. The seed's fields all come from the run of
    median total_time (the lower one of an even count), so their arithmetic still holds."""
    mid = sorted(rounds, key=lambda r: r.total_time)[(len(rounds) - 1) // 2]
    values = {}
    for f in fields(Round):
        xs = [getattr(r, f.name) for r in rounds if getattr(r, f.name) is not None]
        if f.name in SEED_FIELDS or f.name == "concurrency":
            values[f.name] = getattr(mid, f.name)
        elif f.name == "num_finished":
            values[f.name] = min(xs)  # a round that lost a request shows
        else:
            values[f.name] = statistics.median(xs) if xs else None
    return Round(**values)
