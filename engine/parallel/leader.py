"""Rank 0 of tensor parallelism, in the engine's own process: the session's decoder over N
ranks (its cache, mode and notes; no pass of its own). It cuts the loaded model, starts one
follower process per other rank (parallel/follower.py), sends each its tensors, drives in
lockstep the passes of a batch (parallel/batch_ops.py: through `send` and `run`), and
supervises: a failing rank ends the others and surfaces as one TPFailed.
"""

from __future__ import annotations

import gc
import os
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import replace
from pathlib import Path

import torch
import torch.distributed as dist

from engine.config.backends import Backends
from engine.events import BadRequest
from engine.parallel.follower import OP_SETUP, OP_STOP, TIMEOUT, Rank, device_id
from engine.parallel.sharded_step import shard, spec_of
from engine.platform.child_env import NO_MULTICAST, child_env
from engine.step.decode import kv_buckets

STARTUP_S = 120  # a follower not joined by then (import, CUDA init) fails the start
ABORT_WAIT_S = 20  # longest close() waits for NCCL's teardown before leaving it to the thread


class TPFailed(RuntimeError):
    """One rank failed and every rank was ended: one sentence naming the rank and its error."""


def rank0_nccl_env(environ) -> dict[str, str]:
    """What rank 0's process sets before NCCL starts in it: multicast off, and NCCL's log on
    stderr unless the user sent it elsewhere. Its stdout is the JSON channel (the worker's, or
    `hearth run --json`'s): under NCCL_DEBUG=WARN, NCCL's version line would break it."""
    return {**NO_MULTICAST, "NCCL_DEBUG_FILE": environ.get("NCCL_DEBUG_FILE", "/dev/stderr")}


class TPLeader:
    """Rank 0: the session's decoder over N GPUs (its own Decoder is `rank.decoder`, which
    parallel/batch_ops.py's RankBatch runs); it starts, drives and supervises the followers."""

    def __init__(self, model, world_size: int, context: int, kv_dtype: str, device,
                 memory_limit_gib: float | None = None, backends: Backends | None = None,
                 num_blocks: int | None = None):
        # BadRequest: nothing started
        self.spec = replace(spec_of(model, world_size, context, kv_dtype, memory_limit_gib),
                            buckets=tuple(kv_buckets(context)),
                            backends=(backends or Backends()).to_json(), num_blocks=num_blocks)
        self.device = torch.device(device)
        if self.device.type == "cuda":  # rank r runs on cuda:r
            if torch.cuda.device_count() < world_size:
                raise BadRequest(f"--tensor-parallel {world_size} needs {world_size} GPUs; torch "
                                 f"sees {torch.cuda.device_count()}")
            self.device = torch.device("cuda", 0)
            from engine.load.loader import apply_memory_limit

            apply_memory_limit(self.device, memory_limit_gib)  # per GPU: followers do the same
        self.backend = "nccl" if self.device.type == "cuda" else "gloo"
        self.mode = "static"
        self.fixed_threads = False
        self.epoch = 0  # the batched decoder whose pass the followers ran last (batch_ops.py)
        self.notes = [f"tensor parallel over {world_size} "
                      f"{'GPUs' if self.backend == 'nccl' else 'CPU processes'} ({self.backend})"]
        self._procs: dict[int, subprocess.Popen] = {}
        self._logs: dict[int, Path] = {}  # each follower's stderr; kept when it says something
        self.rank: Rank | None = None
        self._failure: TPFailed | None = None
        self._dead: int | None = None  # a follower the watchdog saw exit
        self._closing = False
        self._abort_lock = threading.Lock()
        self._abort_thread: threading.Thread | None = None
        self._store = dist.TCPStore("127.0.0.1", 0, world_size, is_master=True, timeout=TIMEOUT,
                                    wait_for_workers=False)
        self._store.set("spec", self.spec.to_json())
        try:
            self._start(model)
        except Exception as e:
            raise self._fail(e) from e
        self.cache = self.rank.cache

    def _start(self, model) -> None:
        n = self.spec.world_size
        # the weights go one tensor at a time while nothing else runs: NCCL's serializing of
        # unbatched sends is what the load wants, so its warning (every rank's stderr) is noise
        os.environ.setdefault("TORCH_NCCL_SHOW_EAGER_INIT_P2P_SERIALIZATION_WARNING", "false")
        for r in range(1, n):  # stdout stays the worker's JSON channel; tracebacks go to a log
            fd, name = tempfile.mkstemp(prefix=f"hearth-tp-rank{r}-", suffix=".log")
            self._logs[r] = Path(name)
            with os.fdopen(fd, "w") as log:
                self._procs[r] = subprocess.Popen(
                    [sys.executable, "-m", "engine.parallel.follower", "--rank", str(r), "--world",
                     str(n), "--store", f"127.0.0.1:{self._store.port}", "--backend",
                     self.backend, "--leader-pid", str(os.getpid())],
                    env=child_env(), stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                    stderr=log)
        self._await("ready", "start")  # died on its way up (import, device)
        if self.backend == "nccl":
            os.environ.update(rank0_nccl_env(os.environ))  # its communicator reads them here
            torch.cuda.set_device(self.device)
        dist.init_process_group(self.backend, store=self._store, rank=0, world_size=n,
                                timeout=TIMEOUT, **device_id(self.device))
        threading.Thread(target=self._watch, daemon=True, name="tp-watchdog").start()
        for r in range(1, n):
            for _, t in shard(model, self.spec, r, self.device):
                dist.send(t, dst=r)
        self.rank = Rank(self.spec, 0, dict(shard(model, self.spec, 0, self.device)), self.device)
        self._await("loaded", "load")  # a follower's cache that did not fit fails the load

    def _await(self, key: str, what: str) -> None:
        """Until every follower has set `key/r` in the store; raises when one exits first."""
        n, deadline = self.spec.world_size, time.monotonic() + STARTUP_S
        while not self._store.check([f"{key}/{r}" for r in range(1, n)]):
            if self._follower_error(0) is not None:
                raise RuntimeError(f"a follower failed to {what}")
            if time.monotonic() > deadline:
                raise TimeoutError(f"the followers did not {what} within {STARTUP_S} s")
            time.sleep(0.05)

    @property
    def follower_pids(self) -> dict[int, int]:
        """rank -> process id, for telemetry (NVML's memory of each GPU's process)."""
        return {r: p.pid for r, p in self._procs.items()}

    def _watch(self) -> None:
        """A follower that exits while the group runs: NCCL would wait on it until the timeout,
        so abort the group and let the blocked collective raise (gloo raises by itself)."""
        while not self._closing:
            for r, p in self._procs.items():
                if p.poll() is not None and not self._closing:
                    self._dead = r
                    if self.backend == "nccl":
                        self._abort_group(wait_s=0)  # finishes once close() drops the graphs
                    return
            time.sleep(0.1)

    def _follower_error(self, wait_s: float) -> tuple[int, str] | None:
        """(rank, what went wrong) for a follower that raised or exited, waiting up to wait_s."""
        deadline = time.monotonic() + wait_s
        while True:
            for r, p in self._procs.items():
                code = p.poll()
                if self._store.check([f"error/{r}"]):
                    return r, self._store.get(f"error/{r}").decode()
                if code is not None:
                    how = (f"was killed by signal {-code}" if code < 0
                           else f"exited with code {code}")
                    return r, f"the process {how}"
            if time.monotonic() >= deadline:
                return None
            time.sleep(0.05)

    def _abort_group(self, wait_s: float) -> None:
        """Leave the NCCL group by ncclCommAbort, once, on a daemon thread. Not destroy: that
        finalizes with every peer, and the followers exit at OP_STOP without it (and a dead one
        never would). Abort is local, but it waits until every CUDA graph that captured one of the
        communicator's ops is destroyed, so a caller drops its graphs first (pytorch#115388)."""
        with self._abort_lock:
            if self._abort_thread is None and dist.is_initialized():
                self._abort_thread = threading.Thread(
                    target=dist.distributed_c10d._abort_process_group, daemon=True,
                    name="tp-abort")
                self._abort_thread.start()
        if self._abort_thread is not None:
            self._abort_thread.join(wait_s)

    def _fail(self, e: BaseException) -> TPFailed:
        if self._failure is None:
            n = self.spec.world_size
            culprit = self._follower_error(1.0)  # a follower's death is what rank 0 often sees
            r, what = culprit or (0, f"{type(e).__name__}: {e}")
            log = self._logs.get(r)
            log = f" (its log: {log})" if log and log.stat().st_size else ""
            self._failure = TPFailed(f"tensor-parallel rank {r} of {n} failed: {what}; "
                                     f"every rank was stopped{log}")
            self._end(aborted=True)
        return self._failure

    def run(self, fn):
        """fn(), whose collectives every rank runs; any failure ends every rank: TPFailed."""
        if self._failure is not None:
            raise self._failure
        try:
            if self._dead is not None:
                raise RuntimeError(f"follower {self._dead} exited")
            return fn()
        except Exception as e:
            raise self._fail(e) from e

    def _header(self, op: int, a: int, n: int, extra: tuple[int, int, int] = (0, 0, 0)) -> None:
        dist.broadcast(torch.tensor([op, a, n, *extra], dtype=torch.long, device=self.device),
                       src=0)

    def send(self, op: int, a: int, n: int, flag: int, max_rows: int, epoch: int) -> None:
        """The header of a batch pass (parallel/batch_ops.py), inside `run`."""
        self._header(op, a, n, extra=(flag, max_rows, epoch))
        self.epoch = epoch

    def capture_blocks(self, sizes) -> None:
        """Verify rows run as batched prefill passes on the ranks: no verify block to capture."""

    def setup_fast_path(self, allow_graph: bool, compile_layers: bool,
                        reproducible: tuple[int, ...] | None = None) -> None:
        if reproducible is not None:  # resolve_config refuses it first
            raise BadRequest("the reproducible mode does not run under tensor parallelism")

        def run():
            self._header(OP_SETUP, int(allow_graph), int(compile_layers))
            self.rank.setup(allow_graph, compile_layers)
        self.run(run)
        self.notes.extend(self.rank.notes)
        if self.rank.graphs:
            self.mode = "graph"
            self.notes.append(f"decode step captured as {len(self.rank.graphs)} CUDA graphs on "
                              "each GPU")

    def close(self) -> None:
        """Stop the followers and leave the group; safe to call twice, and after a failure."""
        if self._closing:
            return
        self._closing = True  # the watchdog now lets the followers exit
        try:
            self._header(OP_STOP, 0, 0)
            for p in self._procs.values():
                p.wait(timeout=30)
        except Exception:
            self._end(aborted=True)
        else:
            self._end(aborted=False)

    def _end(self, aborted: bool) -> None:
        self._closing = True
        for p in self._procs.values():
            if p.poll() is None:
                p.terminate()
        for p in self._procs.values():
            try:
                p.wait(timeout=5)
            except Exception:
                p.kill()
                p.wait()
        if self.rank is not None:  # NCCL's teardown waits until no graph holds one of its ops
            self.rank.graphs.clear()
        self.rank = None  # the weights and the cache go with it
        gc.collect()
        if self.backend == "nccl":
            self._abort_group(wait_s=ABORT_WAIT_S)
        elif dist.is_initialized():
            dist.destroy_process_group()
        for log in self._logs.values():
            if log.exists() and (not aborted or not log.stat().st_size):
                log.unlink()
