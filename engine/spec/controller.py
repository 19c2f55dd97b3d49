"""How many tokens to propose next (adaptive K) and whether speculation pays at all (the
switch-off), from times measured on this card and model. Pure bookkeeping: no torch.

The model behind adaptive K: with a per-token acceptance rate alpha, a round of K proposals
yields (1 - alpha^(K+1)) / (1 - alpha) tokens and costs K draft steps plus one verify pass of
K + 1 tokens; K is chosen to maximize tokens per second. The switch-off does not trust the
model: it compares the measured time per token of speculation with a measured plain step.
The figures behind the constants: docs/benchmark-log.md, "Tuning notes moved from the code".
"""

from __future__ import annotations

import math
import statistics
from collections import deque
from dataclasses import dataclass

START_K = 4
MAX_ADAPTIVE_K = 8
PROBE_STEPS = 4  # plain steps timed before the first round when no plain step time is known
REPROBE_TOKENS = 256  # and again after this many tokens of speculation: the context grows,
# the machine's load changes; a plain step is never a loss against plain decoding
EARLY_ROUNDS = 2  # rounds since speculation (re)started before it is judged; then after every
# round, as evidence comes in: judged only at the end of long windows, a losing draft loses a
# whole window. The test is one-sided and the acceptance estimate's standard error shrinks as
# rounds come in, so judging often does not switch off winners
MARGIN = 0.05  # speculation must win by this much at the judged acceptance: near break-even the
# two choices cost the same, and an answer that keeps a draft losing a little pays its start too
BACKOFF_TOKENS = 64  # plain tokens after a switch-off; doubles while speculation keeps losing
MAX_BACKOFF_TOKENS = 4096
FIRST_ENTRY_STEPS = 8  # what the first start may count for until a later one is timed
WON_TOKENS = 16  # speculation that kept winning this long rests BACKOFF_TOKENS again at a loss
ENTRY_SHARE = 0.0125  # and at least so many that starting speculation again (a draft's
# prefill, its catch-up over the plain stretch, and the rounds until it is judged again, as the
# last ones lost) costs at most this share of the stretch: frequent re-entries eat the gain
DECAY = 0.9  # exponential forgetting of old rounds in the acceptance estimate (about 10 rounds
# remembered): K follows it, and the switch-off judges by it and by a slower one
SLOW_DECAY = 0.97  # about 33 rounds: the fast estimate alone is too noisy to see a steady loss,
# the slow one alone too slow to see a draft stop being accepted
JUDGE_Z = 1.5  # speculation is switched off only if it loses even at the estimate plus this
# many standard errors: judged after every round, a lower bar switches off winners on a few bad
# rounds (bench/switch_off_sim.py is the tuning aid)
PRIOR_ALPHA, PRIOR_TESTS = 0.6, 2.0
SAMPLES = 15  # timings are medians of the last few: one slow step (a first use, another
# process on the CPU) must not decide


def expected_tokens(alpha: float, k: int) -> float:
    """Tokens one round yields: the accepted run of proposals plus the target's own token."""
    if alpha >= 1.0:
        return k + 1.0
    return (1.0 - alpha ** (k + 1)) / (1.0 - alpha)


def expected_speedup(alpha: float, k: int, c: float) -> float:
    """The issue's formula: c is the draft-to-target step-time ratio, a verify pass costs one
    target step."""
    return expected_tokens(alpha, k) / (k * c + 1.0)


class Median:
    """The median of the last SAMPLES values; None before the first."""

    def __init__(self, first: float | None = None):
        self.values: deque[float] = deque(maxlen=SAMPLES)
        self._median: float | None = None  # kept until the next add: K is chosen every round,
        # from every size's median, and on a fast GPU a round is a fraction of a millisecond
        if first is not None:
            self.add(first)

    def add(self, value: float) -> None:
        self.values.append(value)
        self._median = None

    @property
    def value(self) -> float | None:
        if self._median is None and self.values:
            self._median = statistics.median(self.values)
        return self._median


@dataclass
class Totals:
    rounds: int = 0
    proposed: int = 0
    accepted: int = 0
    tested: int = 0  # proposals the rule judged: the accepted ones and each first rejection
    spec_tokens: int = 0  # tokens the rounds yielded


class Controller:
    """One per session and way of speculating (the session keeps them, so what one generation
    measured and decided carries into the next). `next_k` says what to do next: 0 is a plain
    step."""

    def __init__(self, max_k: int, adaptive: bool, switch_off: bool,
                 plain_step_s: float | None = None):
        self.max_k = max_k
        self.adaptive, self.switch_off = adaptive, switch_off
        self.k = min(START_K, max_k) if adaptive else max_k
        self.plain = Median(plain_step_s)
        self.plain_left = PROBE_STEPS + 1 if switch_off and plain_step_s is None else 0
        self.first_plain = plain_step_s is None  # the first step pays one-time costs: skipped
        self.since_probe = 0  # tokens of speculation since plain steps were last timed
        self.backoff = BACKOFF_TOKENS
        self.switched_off = False
        self.counts = {d: [PRIOR_ALPHA * PRIOR_TESTS, PRIOR_TESTS]  # decayed hits and tests
                       for d in (DECAY, SLOW_DECAY)}
        self.draft = Median()  # seconds per proposed token
        self.verify: dict[int, Median] = {}  # block size T -> seconds
        self.round = Median()  # seconds per round, all sizes
        self.window_rounds, self.window_tokens = 0, 0  # since speculation (re)started
        self.overhead_s = 0.0  # one-off costs of speculating (a draft's prefill), not judged
        self.first_entry_s: float | None = None  # the first of them pays first uses (kernels
        # compiled for the prompt's shape: seconds where a start costs milliseconds)
        self.entries = Median()  # the later ones
        self.totals = Totals()

    def new_generation(self) -> None:
        """Stats count per generation; timings, acceptance and a switch-off carry over."""
        self.totals = Totals()

    @property
    def plain_step_s(self) -> float | None:
        return self.plain.value

    def time_per_token(self, rounds: int, tokens: int) -> float:
        """Seconds a token of speculation costs: a typical round's time over the mean yield
        (a round takes about as long whatever it yields)."""
        return self.round.value * rounds / tokens

    @property
    def alpha(self) -> float:
        hits, tests = self.counts[DECAY]
        return hits / tests

    @property
    def speedup(self) -> float:
        t = self.totals
        if not self.plain_step_s or not t.rounds or self.round.value is None:
            return 0.0
        return self.plain_step_s / self.time_per_token(t.rounds, t.spec_tokens)

    def next_k(self, limit: int) -> int:
        """K for the next round, at most `limit` (what the token budget and context allow)."""
        if self.plain_left > 0:
            return 0
        return max(0, min(self.k, limit))

    def overhead(self, seconds: float) -> None:
        """Time speculation cost outside its rounds (a draft catching up on the prompt). Kept
        for the record, not judged: once paid it is sunk, and switching off cannot win it back
        (charged to the first window, it switched off drafts that won)."""
        self.overhead_s += seconds
        if self.first_entry_s is None:
            self.first_entry_s = seconds
        else:
            self.entries.add(seconds)

    @property
    def entry_s(self) -> float:
        """What starting speculation again costs: the typical later start, else the first, at
        most FIRST_ENTRY_STEPS plain steps (it pays first uses: it may take tens of times a
        later start)."""
        if self.entries.value is not None:
            return self.entries.value
        return min(self.first_entry_s or 0.0, FIRST_ENTRY_STEPS * (self.plain_step_s or 0.0))

    def plain_done(self, seconds: float) -> None:
        if not self.first_plain:
            self.plain.add(seconds)
        self.first_plain = False
        self.since_probe = 0
        if self.plain_left > 0:
            self.plain_left -= 1
            if self.plain_left == 0:
                self.switched_off = False

    def round_done(self, proposed: int, accepted: int, draft_s: float, verify_s: float,
                   seconds: float | None) -> None:
        """One round: `accepted` of `proposed` tokens kept; the round yielded accepted + 1.
        seconds None: a round whose time says nothing of its own cost (a batch's step that also
        ran a prompt's prefill): counted, not timed."""
        t = self.totals
        t.rounds += 1
        t.proposed += proposed
        t.accepted += accepted
        t.tested += accepted + (accepted < proposed)
        t.spec_tokens += accepted + 1
        # alpha: each proposal is tested only if the ones before it were accepted
        for decay, c in self.counts.items():
            c[0] = decay * c[0] + accepted
            c[1] = decay * c[1] + accepted + (accepted < proposed)
        if seconds is not None:
            self.draft.add(draft_s / proposed)
            if proposed + 1 in self.verify:
                self.verify[proposed + 1].add(verify_s)
            else:  # the first pass of a size pays one-time costs (kernels, allocations): skip
                self.verify[proposed + 1] = Median()
            self.round.add(seconds)
        self.window_rounds += 1
        self.window_tokens += accepted + 1
        self.since_probe += accepted + 1
        if self.switch_off and self.window_rounds >= EARLY_ROUNDS and self.plain_step_s \
                and self.round.value is not None:
            self._judge()
        if self.switch_off and self.plain_left == 0 and self.since_probe >= REPROBE_TOKENS:
            self.plain_left = PROBE_STEPS
        if self.adaptive:
            self.k = self.best_k()

    @property
    def judged_alpha(self) -> float:
        """The acceptance the switch-off judges by: each estimate (fast and slow) plus JUDGE_Z
        standard errors (a binomial's, over its decayed count of tests); the lower of the two."""
        bounds = []
        for hits, tests in self.counts.values():
            a = hits / tests
            bounds.append(a + JUDGE_Z * math.sqrt(a * (1.0 - a) / tests))
        return min(1.0, *bounds)

    def predicted_per_token(self, alpha: float | None = None) -> float:
        """Seconds a token of speculation costs at this K: a typical round over the tokens a
        round yields at an acceptance (default: the one estimated for K). Judged instead of
        the window's own yield, which swings with the lengths of a few accepted runs and
        switched off winning rounds."""
        return self.round.value / expected_tokens(self.alpha if alpha is None else alpha,
                                                  self.k)

    def _judge(self) -> None:
        if self.predicted_per_token(self.judged_alpha) * (1.0 + MARGIN) <= self.plain_step_s:
            if self.window_tokens >= WON_TOKENS:  # a loss after this is a new one
                self.backoff = BACKOFF_TOKENS
            return
        # the rest's length: doubling while speculation keeps losing, and long enough that
        # starting again (the draft's catch-up, and rounds that lose as these did until judged)
        # costs at most ENTRY_SHARE of it
        lost = max(0.0, self.window_rounds * self.round.value
                   - self.window_tokens * self.plain_step_s)  # typical rounds: not a first use
        least = (self.entry_s + lost) / (ENTRY_SHARE * self.plain_step_s)
        self.switched_off = True
        self.plain_left = min(max(self.backoff, int(least) + 1), MAX_BACKOFF_TOKENS)
        self.backoff = min(2 * self.backoff, MAX_BACKOFF_TOKENS)
        self.window_rounds, self.window_tokens = 0, 0

    def verify_time(self, size: int, measured: list[tuple[int, float]] | None = None) -> float:
        """Predicted seconds of a verify pass (and its accept rule) over `size` tokens: measured
        sizes as measured, others interpolated between the nearest measured ones, or equal to
        the nearest beyond the measured range, an optimistic guess that gets K explored.
        `measured`: _measured_verify(), when the caller asks for several sizes at once."""
        if measured is None:
            measured = self._measured_verify()
        if not measured:
            return self.plain_step_s or 0.0
        below = [(t, v) for t, v in measured if t <= size]
        above = [(t, v) for t, v in measured if t > size]
        if not below or not above:
            return (below[-1] if below else above[0])[1]
        (t0, v0), (t1, v1) = below[-1], above[0]
        return v0 + (v1 - v0) * (size - t0) / (t1 - t0)

    def _measured_verify(self) -> list[tuple[int, float]]:
        """(size, median seconds) of every verify size timed so far, smallest first."""
        return sorted((t, m.value) for t, m in self.verify.items() if m.values)

    def best_k(self) -> int:
        draft_s = self.draft.value
        measured = self._measured_verify()
        if draft_s is None or not measured:
            return self.k
        alpha = self.alpha
        rates = {k: expected_tokens(alpha, k) / (k * draft_s + self.verify_time(k + 1, measured))
                 for k in range(1, min(self.max_k, MAX_ADAPTIVE_K) + 1)}
        return max(rates, key=rates.get)
