"""The thread governor (platform/cpu_threads.py): fewer threads while other processes keep the
CPU busy, back to one per physical core when they stop; by its readings (fake clocks and
counters), by /proc/stat, and by its effect on torch in a session decoding beside busy loops."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest
import torch

from engine.platform import cpu_threads
from engine.platform.cpu_threads import ThreadGovernor, busy_seconds, governor_for
from tests.engine.helpers import greedy_request


class Machine:
    """A fake clock and CPU counters: `others` cores' worth of other processes' work and
    `mine` of this process's, per second of the clock."""

    def __init__(self):
        self.t = self.busy = self.own = 0.0

    def run(self, seconds: float, others: float, mine: float) -> None:
        self.t += seconds
        self.busy += (others + mine) * seconds
        self.own += mine * seconds


def _governor(machine: Machine, cpus: int = 4, most: int = 4):
    chosen = []
    gov = ThreadGovernor(chosen.append, most=most, busy=lambda: machine.busy,
                         own=lambda: machine.own, clock=lambda: machine.t,
                         cpus=set(range(cpus)))
    return gov, chosen


def test_it_yields_the_cores_others_keep_busy_and_takes_them_back():
    m = Machine()
    gov, chosen = _governor(m)
    m.run(1.0, others=0.0, mine=4.0)
    assert gov.tick() == 4 and chosen == []  # quiet: as many as it started with
    m.run(1.0, others=2.0, mine=2.0)
    assert gov.tick() == 2 and chosen == [2]  # two cores busy elsewhere
    m.run(1.0, others=3.7, mine=0.3)  # crowded out: others read high, at least one stays
    assert gov.tick() == 1
    m.run(1.0, others=0.2, mine=1.0)
    assert gov.tick() == 4 and chosen == [2, 1, 4]  # they stopped: back to every core


def test_its_first_read_covers_the_time_since_an_earlier_sample():
    m = Machine()
    start = (m.t, m.busy, m.own)
    m.run(5.0, others=4.0, mine=1.0)  # the load, beside busy processes
    gov = ThreadGovernor(lambda n: None, most=4, busy=lambda: m.busy, own=lambda: m.own,
                         clock=lambda: m.t, cpus=set(range(4)), since=start)
    assert gov.tick() == 1  # at once, before the first token


def test_it_reads_at_most_every_interval():
    m = Machine()
    gov, chosen = _governor(m)
    m.run(0.1, others=4.0, mine=0.0)
    assert gov.tick() == 4 and chosen == []  # too soon to read
    m.run(0.5, others=4.0, mine=0.0)
    assert gov.tick() == 1


def test_half_a_free_core_counts_as_one_and_most_caps_it():
    m = Machine()
    gov, _ = _governor(m, cpus=2, most=2)
    m.run(1.0, others=0.6, mine=1.4)  # 1.4 free: one thread
    assert gov.tick() == 1
    m.run(1.0, others=0.4, mine=1.0)  # 1.6 free: two
    assert gov.tick() == 2
    gov, _ = _governor(m, cpus=8, most=2)  # hyper-threads: one per physical core at most
    m.run(1.0, others=0.0, mine=2.0)
    assert gov.tick() == 2


def test_proc_stat_counts_busy_time_on_the_cpus_given(tmp_path):
    stat = tmp_path / "stat"
    hz = __import__("os").sysconf("SC_CLK_TCK")
    stat.write_text(f"cpu  {9 * hz} 0 0 0 0 0 0 0 0 0\n"
                    f"cpu0 {hz} {hz} {hz} {50 * hz} {hz} 0 0 0 0 0\n"
                    f"cpu1 {2 * hz} 0 0 {9 * hz} 0 0 0 0 0 0\n"
                    f"cpu2 {5 * hz} 0 0 0 0 0 0 0 0 0\nintr 1 2 3\n")
    assert busy_seconds({0, 1}, stat) == 5.0  # user, nice, system; not idle, not iowait
    assert busy_seconds({2}, stat) == 5.0
    assert busy_seconds({0}, tmp_path / "missing") is None
    if sys.platform.startswith("linux"):
        assert busy_seconds(cpu_threads.usable_cpus()) > 0


def test_no_governor_on_a_gpu_or_where_the_user_chose_the_count():
    assert governor_for(torch.device("cuda")) is None
    cores = str(cpu_threads.physical_cores())
    assert governor_for(torch.device("cpu"), {"OMP_NUM_THREADS": cores + "1"}) is None
    assert governor_for(torch.device("cpu"), {"OMP_NUM_THREADS": cores}) is not None
    assert governor_for(torch.device("cpu"), {}) is not None


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/stat")
def test_a_session_beside_busy_loops_drops_to_one_thread(tiny_models):
    """Its effect: torch's thread count in the generating thread, with two busy processes per
    usable CPU beside a session (more than the machine can give), is one."""
    from engine.generate.session import Session

    threads = torch.get_num_threads()
    session = Session.load(_load(tiny_models["qwen2"]))
    try:
        assert session.threads is not None
        session.threads.most = 2  # two threads to give up, on a one-core machine too
        session.threads._interval = 0.05
        loops = [subprocess.Popen([sys.executable, "-c", "while True: pass"])
                 for _ in range(2 * len(cpu_threads.usable_cpus()))]
        try:
            time.sleep(0.3)
            deadline = time.monotonic() + 20
            while session.threads.threads != 1 and time.monotonic() < deadline:
                list(session.generate(greedy_request(n=64, ignore_eos=True)))
            assert session.threads.threads == 1 and torch.get_num_threads() == 1
        finally:
            for p in loops:
                p.kill()
    finally:
        session.close() if hasattr(session, "close") else None
        torch.set_num_threads(threads)


def _load(model):
    from engine.events import LoadRequest

    return LoadRequest(model=str(model), device="cpu")


def test_a_proc_stat_it_cannot_read_leaves_the_count_alone(tmp_path):
    stat = tmp_path / "stat"
    stat.write_text("cpu0 lots of time\n")
    assert busy_seconds({0}, stat) is None
    stat.write_text("cpu0 1 2\n")
    assert busy_seconds({0}, stat) is None
