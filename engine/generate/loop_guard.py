"""The loop guard, and why an answer ends short of eos. An answer that has begun repeating itself
token for token (a small model can say one sentence over and over until the token limit) ends
where the loop is plain, with the finish reason "repetition". Both generation loops ask
`end_reason` after every token (generate/session.py, generate/batch_run.py).

A loop is a span of p tokens (p up to MAX_PERIOD) repeated back to back at least MIN_REPEATS
times and over at least MIN_LOOP_TOKENS tokens: the second bound keeps a short span (a row of
zeros in an array, a ruler of dashes) from counting until it is plainly stuck.
"""

from __future__ import annotations

from engine.generate import constrained

MAX_PERIOD = 256  # the longest repeated span looked for, in tokens
MIN_REPEATS = 4
MIN_LOOP_TOKENS = 64


def loop_span(period: int) -> int:
    """Tokens of back-to-back copies of a `period`-token span that make a loop."""
    return max(MIN_REPEATS * period, MIN_LOOP_TOKENS)


def repeats(ids: list[int]) -> bool:
    """Whether `ids` ends in a loop: its last loop_span(p) tokens have period p for some p up to
    MAX_PERIOD. Asked after every token, it finds a loop the token it becomes long enough. Cost:
    a search of the last MAX_PERIOD tokens for the newest one (in C), and a comparison for each
    period at which the newest tokens already repeat."""
    n = len(ids)
    if n < MIN_LOOP_TOKENS:
        return False
    last = ids[-1]
    recent = ids[-MAX_PERIOD - 1:-1][::-1]  # recent[p - 1] is ids[-1 - p]
    p = 0
    while True:
        try:
            p = recent.index(last, p) + 1  # the next period at which the newest token repeats
        except ValueError:
            return False
        span = loop_span(p)
        # the last `span` tokens have period p: they equal themselves shifted by p (the two
        # tokens before the newest first: most candidates fail there, before any slicing)
        if span <= n and ids[-2] == ids[-2 - p] and ids[n - span + p:] == ids[n - span:n - p]:
            return True


def end_reason(req, generated: list[int], stopped: bool, n_new: int, max_new: int,
               sampler=None) -> str | None:
    """Why an answer ends at its newest token (generated[-1], its n_new-th) other than the
    model's eos, or None where it goes on: its grammar complete (the sampler's, "eos": the
    answer ended where it should), a stop string (`stopped`), a loop where the request asked
    for the guard (never with ignore_eos: a benchmark runs to its limit), or the token limit."""
    if constrained.complete(sampler, n_new):
        return "eos"
    if stopped:
        return "stop_string"
    if req.stop_on_repetition and not req.ignore_eos and repeats(generated):
        return "repetition"
    return "max_tokens" if n_new >= max_new else None
