"""Fault injection for tensor-parallel followers, test-only: a follower started with
HEARTH_TP_FOLLOWER_HOOK=tests.engine.parallel.faults:install calls install(rank), which wraps
Rank's methods as the variables below ask. Production code holds only the hook point."""

from __future__ import annotations

import os

HOOK = "tests.engine.parallel.faults:install"
FAIL_AT_STEP = "HEARTH_TEST_TP_FAIL_AT_STEP"  # "R:S": follower R raises at its decode step S
FAIL_AT_LOAD = "HEARTH_TEST_TP_FAIL_AT_LOAD"  # "R": follower R raises once its weights came


def inject(monkeypatch, name: str, value: str) -> None:
    """Make the followers started from now on fail as `name` = `value` says."""
    monkeypatch.setenv("HEARTH_TP_FOLLOWER_HOOK", HOOK)
    monkeypatch.setenv(name, value)


def install(rank: int) -> None:
    from engine.parallel import follower

    if os.environ.get(FAIL_AT_LOAD) == str(rank):
        def fail_load(self, *args, **kwargs):  # where a real load fails: its cache
            raise RuntimeError(f"injected failure at load ({FAIL_AT_LOAD})")

        follower.Rank.__init__ = fail_load
    fail_rank, _, fail_step = os.environ.get(FAIL_AT_STEP, "-1:-1").partition(":")
    if int(fail_rank) == rank:  # a batch's decode steps, counted by the rank
        step = follower.Rank.batch_step

        def failing(self, *args):
            if self.num_steps + 1 == int(fail_step):
                raise RuntimeError(f"injected failure at decode step {fail_step} "
                                   f"({FAIL_AT_STEP})")
            return step(self, *args)

        follower.Rank.batch_step = failing
