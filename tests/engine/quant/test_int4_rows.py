"""The per-shape row count from which a 4-bit layer's product goes through the Triton GEMM
(quant/int4_rows.py): the choice from measured times, every layer of a shape set by
one measurement, other kernels left alone, and Int4Linear's dispatch following it. The timing
itself and the kernels run on a GPU (tests/engine/kernels/test_int4_gemm_kernel.py checks the
GEMM at 16 and 65 rows there); here the timer is a stand-in."""

from __future__ import annotations

import pytest
import torch

from engine.quant import int4_linear, int4_rows
from engine.quant.int4_linear import TINYGEMM_MAX_ROWS, Int4Linear


def test_the_gemm_takes_over_from_where_it_stays_faster():
    assert int4_rows.gemm_from({16: (30, 40), 32: (60, 50), 64: (120, 60)}, 65) == 32
    assert int4_rows.gemm_from({16: (30, 20), 32: (60, 50), 64: (120, 60)}, 65) == 16
    assert int4_rows.gemm_from({16: (1, 2), 32: (1, 2), 64: (1, 2)}, 65) == 65
    # faster at 16 and 64 but not at 32: only from 64 on is it faster at every larger count
    assert int4_rows.gemm_from({16: (10, 5), 32: (10, 20), 64: (10, 5)}, 65) == 64


def layer(N: int, K: int, kernel: str = "tinygemm") -> Int4Linear:
    """A layer with the right attributes; its tensors are never multiplied here."""
    return Int4Linear(K, N, 128, kernel, torch.zeros(N // 8, 1, dtype=torch.int32),
                      torch.zeros(K // 128, N, 2, dtype=torch.bfloat16))


def test_one_measurement_sets_every_layer_of_a_shape(monkeypatch):
    monkeypatch.setattr(int4_rows, "tinygemm_gemm_ok", lambda device: True)
    a, b, c = layer(512, 256), layer(512, 256), layer(256, 256)
    other = layer(512, 256, kernel="triton")
    for m in (a, b, c, other):
        m.fused_prefill = True
    # per shape: (tinygemm, GEMM) at 16, 32, 64 rows, in the order tune times them
    times = iter([30, 40, 60, 50, 120, 60,  # 512 x 256: the GEMM from 32 rows
                  10, 20, 20, 30, 40, 50])  # 256 x 256: never
    calls = []

    def timer(fn):
        calls.append(fn)
        return next(times)

    note = int4_rows.tune([a, other, b, c], timer)
    assert len(calls) == 12  # two shapes, not three layers
    assert (a.gemm_rows, b.gemm_rows, c.gemm_rows) == (32, 32, TINYGEMM_MAX_ROWS + 1)
    assert other.gemm_rows == TINYGEMM_MAX_ROWS + 1
    assert "512x256: 32" in note and "256x256: none" in note


def test_nothing_is_timed_where_the_gemm_does_not_check_out(monkeypatch):
    monkeypatch.setattr(int4_rows, "tinygemm_gemm_ok", lambda device: False)
    m = layer(512, 256)
    m.fused_prefill = True
    assert int4_rows.tune([m], lambda fn: 1 / 0) == ""
    assert m.gemm_rows == TINYGEMM_MAX_ROWS + 1


def test_the_layer_follows_its_row_count(monkeypatch):
    monkeypatch.setattr(int4_linear, "tinygemm_gemm_ok", lambda device: True)
    m = layer(512, 256)
    m.fused_prefill = True
    assert not m._fused_gemm(64) and m._fused_gemm(65)  # untuned: above TINYGEMM_MAX_ROWS
    m.gemm_rows = 32
    assert not m._fused_gemm(16) and m._fused_gemm(32) and m._fused_gemm(64)
    m.fused_prefill = False  # HEARTH_INT4_PREFILL=unpack: never
    assert not m._fused_gemm(512)


def test_a_failed_timing_keeps_the_default(monkeypatch):
    monkeypatch.setattr(int4_rows, "tinygemm_gemm_ok", lambda device: True)
    m = layer(512, 256)
    m.fused_prefill = True

    def broken(fn):
        raise RuntimeError("no GPU here")

    assert "512x256: not measured (RuntimeError)" in int4_rows.tune([m], broken)
    assert m.gemm_rows == TINYGEMM_MAX_ROWS + 1


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("kernel", ["tinygemm", "mma"])
def test_batched_awq_steps_through_the_gemm_in_graphs(kernel, tiny_awq, monkeypatch):
    """20 rows of a batched AWQ step (captured at 32) with every layer's product through the
    Triton GEMM from 16 rows (tinygemm's layout) or the mma kernel: graphs equal eager steps, and
    the rows land as close to the same model's rows on the CPU (another bf16 order) as each row
    alone does."""
    from engine.events import LoadRequest
    from engine.generate.session import Session
    from tests.engine.generate.test_batch_run import teacher_forced_rows

    monkeypatch.setenv("HEARTH_INT4_KERNEL", kernel)
    folder = str(tiny_awq["qwen2"]["awq"])
    reference, _ = teacher_forced_rows(Session.load(LoadRequest(
        folder, device="cpu", context=2048, kv_tokens=16384)), 20, 4)
    s = Session.load(LoadRequest(folder, device="cuda", context=2048, kv_tokens=16384))
    assert s.decoder.mode == "graph"
    layers = [getattr(p, f) for p in s.decoder.family.layers for f in ("qkv", "gate_up", "down")]
    if not all(isinstance(m, Int4Linear) and m.kernel == kernel
               and (kernel != "tinygemm" or m.fused_prefill) for m in layers):
        pytest.skip(f"{kernel} does not run here")
    for m in layers:
        m.gemm_rows = 16
    single, graphs = teacher_forced_rows(s, 20, 4)
    _, eager = teacher_forced_rows(s, 20, 4, eager=True)
    assert torch.equal(graphs, eager)
    alone = (single.cpu() - reference).norm(dim=-1) / reference.norm(dim=-1)
    batched = (graphs.cpu() - reference).norm(dim=-1) / reference.norm(dim=-1)
    assert alone.median() > 0  # two bf16 orders really differ: the yardstick is not zero
    assert batched.median() <= 1.25 * alone.median() and batched.max() <= 2 * alone.max()
