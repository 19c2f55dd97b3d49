"""One process per rank of tensor parallelism: what every rank runs (`Rank`: a Decoder over its
sharded step and cache) and the follower process, `python -m engine.parallel.follower`, started by
rank 0 (parallel/leader.py). Not the math: that is the family step's (parallel/sharded_step.py).

A follower joins the process group (gloo on CPU, NCCL on CUDA), receives its tensors from rank 0,
then executes rank 0's ops in lockstep: each is a header of HEADER ints broadcast by rank 0, then
the op's tensors: a batch's passes (parallel/batch_ops.py), the only passes a split model runs.
It raises -> it leaves its error in the store and exits; rank 0 ends the rest.
"""

from __future__ import annotations

import argparse
import faulthandler
import os
import signal
import sys
import threading
import time
import traceback
from datetime import timedelta
from typing import NoReturn

import torch
import torch.distributed as dist

from engine.cache.kv_cache import KVCache
from engine.config import overrides
from engine.config.backends import Backends
from engine.models import fused_ops
from engine.parallel import batch_ops
from engine.parallel.sharded_step import DTYPES, TPSpec, layout, rank_step
from engine.platform import nvrtc
from engine.step.batched import BatchedDecoder
from engine.step.decode import Decoder

OP_SETUP, OP_STOP = 4, 5  # the batch's passes are batch_ops.py's
HEADER = 6  # ints: op, a, n, and a batch pass's flag, its max_rows and epoch
TIMEOUT = timedelta(minutes=10)  # longest a collective may wait (first compile and capture)


class Rank:
    """One rank's side of the lockstep: a Decoder over its step and its cache (its KV heads
    only), under the batched decoder that runs rank 0's passes."""

    def __init__(self, spec: TPSpec, rank: int, weights: dict[str, torch.Tensor], device):
        self.device = device
        self.backends = Backends.from_json(spec.backends) if spec.backends else Backends()
        nvrtc.use_pdl(self.backends.pdl)  # rank 0's, as every other setting
        # rank 0's blocks are every rank's: a follower binds the tables a batch pass sends and
        # its own block manager stays unused
        cache = KVCache(spec.num_layers, spec.num_kv_heads // spec.world_size, spec.head_dim,
                        spec.context, DTYPES[spec.kv_dtype], device, backends=self.backends,
                        num_blocks=spec.num_blocks)
        self.decoder = Decoder(None, cache, device, family=rank_step(spec, rank, weights, cache))
        if tuple(self.decoder.buckets) != spec.buckets:  # every rank must pick the same graph
            raise RuntimeError(f"KV buckets {self.decoder.buckets} differ from rank 0's "
                               f"{list(spec.buckets)}")
        self.num_steps = 0  # batched decode steps
        self.notes: list[str] = []  # what setup chose, for rank 0's load event
        self._batch: tuple[int, BatchedDecoder] | None = None  # (rank 0's epoch, ours)

    @property
    def cache(self) -> KVCache:
        return self.decoder.cache

    @property
    def graphs(self) -> dict:
        return self.decoder.graphs

    def batched(self, max_rows: int, epoch: int) -> BatchedDecoder:
        """The batched decoder mirroring rank 0's of this epoch (parallel/batch_ops.py)."""
        if self._batch is None or self._batch[0] != epoch:
            self._batch = (epoch, BatchedDecoder(self.decoder, max_rows))
        return self._batch[1]

    def batch_step(self, batch: BatchedDecoder, n: int, kv_len: int) -> torch.Tensor:
        """The batched step staged in `batch` (n rows, buckets up to kv_len)."""
        self.num_steps += 1
        return batch.launch(n, kv_len, None if batch.use_graphs
                            else batch.inputs[2, :n].tolist())

    @torch.inference_mode()
    def setup(self, allow_graph: bool, compile_layers: bool) -> None:
        """As Decoder.setup_fast_path, on every rank at once: the warm-up and the captured steps
        run their collectives in the same order everywhere. A capture that fails fails the rank
        (the others would wait on its collectives), unlike on one GPU."""
        step = self.decoder.family
        # no collectives inside: ranks may differ here (the load event says rank 0's)
        fused = fused_ops.prepare(step, self.device, compile_layers)
        # the sum after each row-parallel linear, agreed by every rank; compiled layers keep
        # NCCL (the symmetric buffers' turns are Python state)
        note = None if compile_layers else step.reduce.setup(
            step.embed.shape[1], step.embed.dtype, self.device,  # embed: [vocab, hidden]
            setting=self.backends.tp_all_reduce)
        self.notes = [n for n in (fused, note) if n]
        if self.device.type == "cuda" and allow_graph:
            self.decoder.capture()  # the warm-up off the capture stream does NCCL's lazy setup


def device_id(device: torch.device) -> dict:
    """init_process_group's device_id for NCCL: its communicator is set up at once."""
    return {"device_id": device} if device.type == "cuda" else {}


def follow(rank: int, world: int, store_addr: str, backend: str, leader_pid: int) -> NoReturn:
    """A follower's life: join, receive its tensors, then execute rank 0's ops until OP_STOP."""
    hook = overrides.follower_hook()
    if hook is not None:  # tests: a function that may wrap Rank's methods (fault injection)
        hook(rank)
    threading.Thread(target=_watch_leader, args=(leader_pid,), daemon=True).start()
    faulthandler.register(signal.SIGUSR1, all_threads=True)  # a hang's stacks, into the rank's log
    host, port = store_addr.rsplit(":", 1)
    store = dist.TCPStore(host, int(port), world, is_master=False, timeout=TIMEOUT)
    try:
        spec = TPSpec.from_json(store.get("spec").decode())
        device = torch.device(f"cuda:{rank}" if backend == "nccl" else "cpu")
        if device.type == "cpu":  # ranks share the cores: spinning threads would starve each other
            torch.set_num_threads(max(1, (os.cpu_count() or 1) // world))
        if device.type == "cuda":
            from engine.load.loader import apply_memory_limit

            torch.cuda.set_device(device)
            apply_memory_limit(device, spec.memory_limit_gib)
        store.set(f"ready/{rank}", "1")
        dist.init_process_group(backend, store=store, rank=rank, world_size=world, timeout=TIMEOUT,
                                **device_id(device))
        weights = {}
        for name, shape, dtype in layout(spec):
            weights[name] = torch.empty(shape, dtype=dtype, device=device)
            dist.recv(weights[name], src=0)
        _say(rank, "weights received")
        me = Rank(spec, rank, weights, device)
        store.set(f"loaded/{rank}", "1")  # rank 0 waits for this: a load fails at load
        header = torch.empty(HEADER, dtype=torch.long, device=device)
        while True:
            dist.broadcast(header, src=0)
            op, a, n, flag, max_rows, epoch = header.tolist()
            if op == OP_STOP:  # leave without destroy_process_group: it would finalize with
                break  # peers, and hangs while captured graphs hold the communicator
            if op in (batch_ops.OP_BATCH_PREFILL, batch_ops.OP_BATCH_STEP):
                batch_ops.follow(me, op, a, n, flag, max_rows, epoch)
            elif op == OP_SETUP:
                me.setup(bool(a), bool(n))
                _say(rank, f"set up: {len(me.graphs)} graphs")
    except BaseException as e:
        traceback.print_exc()
        try:
            store.set(f"error/{rank}", f"{type(e).__name__}: {e}")
        finally:
            sys.stderr.flush()
            os._exit(1)  # no teardown: a broken NCCL communicator can hang it
    os._exit(0)  # nothing left to tear down: skip the interpreter's slow exit


def _say(rank: int, what: str) -> None:
    """A stage, into the rank's log (kept when the group fails): where a failure happened."""
    print(f"{time.strftime('%H:%M:%S')} rank {rank}: {what}", file=sys.stderr, flush=True)


def _watch_leader(leader_pid: int) -> None:
    """Rank 0 gone (crashed, killed): end this rank rather than wait on a collective forever."""
    while os.getppid() == leader_pid:
        time.sleep(0.5)
    os._exit(1)


def main(argv: list[str] | None = None) -> NoReturn:
    ap = argparse.ArgumentParser(description="a tensor-parallel follower (started by rank 0)")
    ap.add_argument("--rank", type=int, required=True)
    ap.add_argument("--world", type=int, required=True)
    ap.add_argument("--store", required=True, help="HOST:PORT of rank 0's TCPStore")
    ap.add_argument("--backend", choices=("gloo", "nccl"), required=True)
    ap.add_argument("--leader-pid", type=int, required=True)
    a = ap.parse_args(argv)
    follow(a.rank, a.world, a.store, a.backend, a.leader_pid)


if __name__ == "__main__":  # through the module, so a hook's changes to Rank are the ones run
    from engine.parallel import follower

    follower.main()
