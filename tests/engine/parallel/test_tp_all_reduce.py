"""The choice of all-reduce for tensor parallelism (tp_all_reduce.py), over gloo with two CPU
processes: a candidate is used only where every rank built it, it sums what NCCL sums (eagerly;
graphs on a GPU) and it is faster on the figures every rank agreed on; any rank's failure keeps
NCCL on all of them, without a hang."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from engine.parallel import all_reduce as tp_all_reduce
from engine.parallel.all_reduce import AllReduce

HIDDEN = 64


def _sum(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:  # the same sum by another road
    y = (x @ weight.t()).contiguous()
    dist.all_reduce(y)
    return y


def _candidate(fn=_sum, fail_prepare_on=None, fail_join_on=None):
    def build(dtype, device):
        if dist.get_rank() == fail_prepare_on:
            raise RuntimeError("no such op here")

        def join():
            if dist.get_rank() == fail_join_on:
                raise RuntimeError("rendezvous failed")
            return fn

        return join, "test sum"
    return build


def _scenarios(rank: int, path: str, out: str) -> None:
    dist.init_process_group("gloo", init_method=f"file://{path}", rank=rank, world_size=2)
    torch.set_num_threads(1)
    # the agreed times: the candidate 4 us against NCCL's 10 us, unless a scenario says
    tp_all_reduce._time = lambda fn, x, device: 10e-6 if fn is tp_all_reduce._nccl else 4e-6
    cpu, results = torch.device("cpu"), {}

    def run(name, **kw):
        reduce = AllReduce()
        note = reduce.setup(HIDDEN, torch.float32, cpu, candidate=_candidate(**kw))
        x = torch.full((1, 1, HIDDEN), float(rank + 1))
        results[name] = (note, reduce.name, reduce.linear(x, torch.eye(HIDDEN))[0, 0, 0].item())

    run("faster")
    run("wrong", fn=lambda x, w: 3 * _sum(x, w))
    run("prepare fails on rank 1", fail_prepare_on=1)
    run("join fails on rank 0", fail_join_on=0)
    tp_all_reduce._time = lambda fn, x, device: 10e-6
    run("not faster")
    torch.save(results, f"{out}.{rank}")
    dist.destroy_process_group()


def test_the_sum_is_chosen_alike_on_every_rank(tmp_path):
    mp.spawn(_scenarios, args=(str(tmp_path / "store"), str(tmp_path / "out")), nprocs=2)
    ranks = [torch.load(tmp_path / f"out.{r}") for r in range(2)]
    for results in ranks:
        note, name, total = results["faster"]
        assert name == "test sum" and "test sum 4.0 us, NCCL 10.0 us" in note and total == 3.0
        note, name, total = results["wrong"]
        assert name == "nccl" and "failed its check" in note and total == 3.0
        assert results["prepare fails on rank 1"] == (None, "nccl", 3.0)
        note, name, _ = results["join fails on rank 0"]
        assert name == "nccl" and "could not be set up" in note
        note, name, _ = results["not faster"]
        assert name == "nccl" and note.endswith("test sum 10.0 us, NCCL 10.0 us)")


def test_nccl_by_setting_and_large_messages_by_nccl(monkeypatch):
    """HEARTH_TP_ALL_REDUCE=nccl skips the choice (no collective: no group needed here); a
    product over MAX_BYTES (a prefill chunk's) goes to NCCL whatever was chosen."""
    reduce = AllReduce()
    assert reduce.setup(HIDDEN, torch.float32, torch.device("cpu"), setting="nccl") is None
    assert reduce.name == "nccl"
    seen = []  # tokens of each product, negative where NCCL summed it
    reduce.small = lambda x, w: seen.append(x.shape[1])
    monkeypatch.setattr(tp_all_reduce, "_nccl", lambda x, w: seen.append(-x.shape[1]))
    w = torch.zeros(HIDDEN, 8)  # [out, in]: 64 values a token, 256 bytes in fp32
    most = tp_all_reduce.MAX_BYTES // (HIDDEN * 4)
    for T in (1, most, most + 1):
        reduce.linear(torch.zeros(1, T, 8), w)
    assert seen == [1, most, -(most + 1)]
    with pytest.raises(ValueError, match="tp_all_reduce"):
        reduce.setup(HIDDEN, torch.float32, torch.device("cpu"), setting="fastest")
