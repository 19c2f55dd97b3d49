"""The all-reduce after each row-parallel linear: NCCL's, or a sum through PyTorch's symmetric
memory, where each GPU reads its peers' buffers over NVLink (no ring, no protocol handshake).

A 7B decode step runs 56 of them on 7 KB messages, where NCCL's fixed cost per call adds up to a
large share of a tensor-parallel step (docs/benchmark-log.md). PyTorch's one-shot sum is built for
such small messages. It is chosen at setup only where it is there, computes what
NCCL computes, survives a CUDA graph's capture and replay, and is faster on this machine: every
rank decides the same from the same measurements, agreed over NCCL, so no rank waits on a
collective that another skipped. Multicast stays off (child_env.NO_MULTICAST): the one-shot sum
does not need it. `HEARTH_TP_ALL_REDUCE=nccl` keeps NCCL.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import torch
import torch.distributed as dist
import torch.nn.functional as F

MAX_BYTES = 512 * 1024  # larger messages (prefill chunks) keep NCCL: every rank would read
# every peer's whole buffer, where a ring reads each byte once
TRIALS = 50  # timed replays of each candidate, after a warm-up
MIN_GAIN = 1.05  # the symmetric-memory sum must be this much faster to be used
TOLERANCE = 1e-2  # relative, against NCCL's sum of the same inputs (both sum in fp32 or alike)


def _nccl(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    y = F.linear(x, weight)
    dist.all_reduce(y)
    return y


class AllReduce:
    """A row-parallel linear's product summed over the group: NCCL until `setup` finds something
    faster for products up to MAX_BYTES. One per rank: its step's o and down."""

    def __init__(self):
        self.small: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] = _nccl
        self.name = "nccl"

    def linear(self, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        """x: [1, T, in/N] (this rank's features), weight: [out, in/N] -> [1, T, out], the sum
        of every rank's x @ weight^T."""
        if x.shape[1] * weight.shape[0] * x.element_size() <= MAX_BYTES:
            return self.small(x, weight)
        return _nccl(x, weight)

    def setup(self, hidden: int, dtype: torch.dtype, device: torch.device,
              candidate: Callable | None = None, setting: str = "auto") -> str | None:
        """Choose the sum for a decode step's products ([1, 1, hidden]): on every rank at once.
        `candidate(dtype, device)` -> (join, name) prepares the alternative without a
        collective; join() sets it up with one and returns its linear (tests give one).
        -> a note for the load event, None where NCCL stays without anything to say."""
        if setting not in ("auto", "nccl"):
            raise ValueError(f"tp_all_reduce must be auto or nccl, not {setting!r}")
        if setting == "nccl":
            return None
        build = candidate or _symmetric_memory
        made = _agreed(lambda: build(dtype, device), device)  # local: no collective
        if made is None:
            return None
        join, name = made
        fn = _agreed(join, device)  # the rendezvous: every rank got this far
        if fn is None:
            return f"tensor parallel all-reduce: NCCL ({name} could not be set up here)"
        g = torch.Generator().manual_seed(dist.get_rank())
        x = torch.randn(1, 1, hidden, generator=g).to(device, dtype)
        w = (torch.randn(hidden, hidden, generator=g) / hidden ** 0.5).to(device, dtype)
        if _agreed(lambda: _check(fn, x, w), device) is None:
            return f"tensor parallel all-reduce: NCCL ({name} failed its check here)"
        times = _agreed(lambda: [_time(_nccl, x, w), _time(fn, x, w)], device)
        if times is None:
            return f"tensor parallel all-reduce: NCCL ({name} could not be timed here)"
        slowest = torch.tensor(times, dtype=torch.float64, device=device)
        dist.all_reduce(slowest, op=dist.ReduceOp.MAX)  # the same figures on every rank
        nccl_s, other_s = slowest.tolist()
        if other_s * MIN_GAIN < nccl_s:
            self.small, self.name = fn, name
        return (f"tensor parallel linear + all-reduce of {hidden} values: {self.name} ({name} "
                f"{other_s * 1e6:.1f} us, NCCL {nccl_s * 1e6:.1f} us)")


def _agreed(attempt: Callable, device: torch.device):
    """attempt() on every rank -> its result where it succeeded on every rank, else None on
    all of them (one MIN over the group: a rank that failed says so before the next step)."""
    try:
        result, ok = attempt(), 1
    except Exception:
        result, ok = None, 0
    flag = torch.tensor([ok], dtype=torch.int32, device=device)
    dist.all_reduce(flag, op=dist.ReduceOp.MIN)
    return result if int(flag.item()) == 1 else None


def _check(fn: Callable, x: torch.Tensor, w: torch.Tensor) -> bool:
    """fn's summed product against NCCL's, eagerly, twice in a row (its buffers alternate), and
    replayed from a CUDA graph on a GPU."""
    want = _nccl(x, w).float()
    got = [fn(x, w).float(), fn(x, w).float()]
    if x.is_cuda:  # captured as the decode step will capture it
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            out = fn(x, w)
        graph.replay()
        got.append(out.float())
        torch.cuda.synchronize(x.device)
    error = max(((y - want).norm() / want.norm()).item() for y in got)
    if not error < TOLERANCE:  # (NaN included)
        raise ValueError(f"relative error {error:.1e}")
    return True


def _time(fn: Callable, x: torch.Tensor, w: torch.Tensor) -> float:
    """Seconds per summed product as the decode step runs it: TRIALS captured in one CUDA
    graph, its second replay timed by GPU events (eagerly, a slow host's launches would be
    timed instead); on a CPU, host time."""
    for _ in range(3):
        fn(x, w)
    if not x.is_cuda:
        t = time.perf_counter()
        for _ in range(TRIALS):
            fn(x, w)
        return (time.perf_counter() - t) / TRIALS
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(TRIALS):
            fn(x, w)
    graph.replay()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    graph.replay()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / 1e3 / TRIALS


def _symmetric_memory(dtype: torch.dtype, device: torch.device):
    """-> (join, name): the product written straight into a symmetric buffer and summed there
    by PyTorch's one-shot all-reduce, no copy in or out. Two buffers, used in turn: a rank that
    runs ahead writes the next product into the other one while a peer may still be reading
    this one (each sum begins with a barrier, so two apart is safe). join() rendezvouses them
    with the default group. Raises where this torch or machine lacks any of it."""
    if device.type != "cuda":
        raise RuntimeError("symmetric memory needs CUDA")
    import torch.distributed._symmetric_memory as symm_mem

    op = torch.ops.symm_mem.one_shot_all_reduce  # AttributeError where this torch lacks it
    group = dist.group.WORLD.group_name
    buffers = [symm_mem.empty(MAX_BYTES // dtype.itemsize, dtype=dtype, device=device)
               for _ in range(2)]
    turn = [0]

    def linear(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        T, n = x.shape[1], weight.shape[0]
        buffer = buffers[turn[0]]
        turn[0] ^= 1  # every rank makes the same calls in the same order: the same turn; a
        # pass makes two a layer, so each captured step begins on the same buffer
        product = buffer[: T * n]
        torch.mm(x.reshape(T, -1), weight.t(), out=product.view(T, n))  # [T, in/N] @ [in/N, n]
        return op(product, "sum", group).view(1, T, n)

    def join():
        for b in buffers:
            symm_mem.rendezvous(b, group)
        return linear

    return join, "symmetric-memory one-shot"
