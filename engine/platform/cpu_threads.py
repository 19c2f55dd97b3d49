"""How many CPU threads a decode step should use now: one per physical core while the machine is
quiet, fewer while other processes keep its cores busy (docs/benchmark-log.md, "A busy CPU").

Why at run time: an OpenMP team of N threads waits, at every kernel of a step, for its slowest
member; with another process busy on a core, that member waits for the scheduler, and decode
crawls. One thread is never waited for. The wait policy alone cannot fix both cases: passive
waiting costs a quiet machine about 14% (each small kernel pays a wake-up), spinning starves a
busy one. So the threads keep OpenMP's spin (child_env.thread_policy) and this governor drops to
the cores the other processes leave free, and comes back when they are done.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path

from engine.platform.child_env import physical_cores

INTERVAL_S = 0.2  # how often the load is read (a /proc/stat read costs about 20 us)
_PROC_STAT = Path("/proc/stat")


def usable_cpus() -> set[int]:
    if hasattr(os, "sched_getaffinity"):
        return os.sched_getaffinity(0)
    return set(range(os.cpu_count() or 1))


def busy_seconds(cpus: set[int], stat: Path = _PROC_STAT) -> float | None:
    """CPU seconds spent busy (not idle, not waiting for I/O) on `cpus` since boot, by every
    process; None where /proc/stat is not there (not Linux) or not as Linux writes it."""
    try:
        lines = stat.read_text().splitlines()
        ticks = 0
        for line in lines:
            name, _, rest = line.partition(" ")
            if not (name.startswith("cpu") and name[3:].isdigit() and int(name[3:]) in cpus):
                continue
            # user nice system idle iowait irq softirq steal [guest guest_nice: inside user]
            fields = [int(f) for f in rest.split()[:8]]
            ticks += sum(fields) - fields[3] - fields[4]
    except (OSError, ValueError, IndexError):  # not there, or not in the format we know
        return None
    return ticks / os.sysconf("SC_CLK_TCK")


class ThreadGovernor:
    """Call tick() often (every decode step): at most every `interval_s` it reads how busy the
    other processes kept this process's CPUs and sets torch's thread count (in the calling
    thread: OpenMP's thread count is per thread) to the cores they left free, at least one, at
    most one per physical core. `threads` is the count it set last."""

    def __init__(self, set_threads: Callable[[int], None], most: int | None = None,
                 interval_s: float = INTERVAL_S, busy: Callable[[], float | None] | None = None,
                 own: Callable[[], float] = time.process_time,
                 clock: Callable[[], float] = time.monotonic, cpus: set[int] | None = None,
                 since: tuple[float, float | None, float] | None = None):
        cpus = usable_cpus() if cpus is None else cpus
        self.cpus = len(cpus)
        self.most = physical_cores(cpus) if most is None else most
        self.threads = self.most
        self._set, self._interval, self._own, self._clock = set_threads, interval_s, own, clock
        self._busy = busy or (lambda: busy_seconds(cpus))
        # `since`: an earlier sample (the process's start: the first read, at the first prefill,
        # then covers the load, and a busy machine is seen before the first token)
        self._last = since or self._sample()

    def _sample(self) -> tuple[float, float | None, float]:
        return self._clock(), self._busy(), self._own()

    def others_busy(self, then, now) -> float | None:
        """Cores' worth of CPU the other processes used between two samples."""
        (t0, b0, o0), (t1, b1, o1) = then, now
        if b0 is None or b1 is None or t1 <= t0:
            return None
        return max(0.0, ((b1 - b0) - (o1 - o0)) / (t1 - t0))

    def tick(self) -> int:
        if self._clock() - self._last[0] < self._interval:
            return self.threads
        now = self._sample()
        others = self.others_busy(self._last, now)
        self._last = now
        if others is None:
            return self.threads
        # half a core free counts as one: our own threads, when they outnumber the free cores,
        # take a share of the others' time, so `others` reads low while we crowd them
        want = max(1, min(self.most, int(self.cpus - others + 0.5)))
        if want != self.threads:
            self._set(want)
            self.threads = want
        return self.threads


def governor_for(device, environ=os.environ) -> ThreadGovernor | None:
    """A governor for a session on the CPU, over torch's thread count now (the policy's one per
    physical core); None on a GPU, and where the user chose another count (OMP_NUM_THREADS)."""
    if device.type != "cpu":
        return None
    chosen = environ.get("OMP_NUM_THREADS", "")
    if chosen and chosen != str(physical_cores()):
        return None
    import torch

    return ThreadGovernor(torch.set_num_threads, most=torch.get_num_threads(), since=_AT_IMPORT)


def _first_sample() -> tuple[float, float | None, float]:
    return time.monotonic(), busy_seconds(usable_cpus()), time.process_time()


_AT_IMPORT = _first_sample()  # the engine's start, near enough: the generate layer imports this
