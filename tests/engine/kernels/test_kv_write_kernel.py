"""The fused quantize-on-write kernel (engine/kernels/kv_write_kernel.py) against
kv_quant.quantize, the
PyTorch rounding it must reproduce bit for bit: int8 codes and fp16 scales identical (a scale per
group of 32 elements, and one per head for a head that is not a multiple of 32), through a
block table and without one; in Triton's CPU interpreter where Triton is installed (CI has none),
compiled on a GPU."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

from engine.cache import kv_arena
from engine.cache.kv_cache import KVCache
from engine.kernels import attention_backend, kv_quant
from tests.engine.helpers import REPO

CHECK = r"""
import sys, torch
from engine.kernels import kv_quant
from engine.kernels import kv_write_kernel

def inputs(T, H, D, seed, device):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(T, H, D, generator=g) * (torch.rand(T, H, 1, generator=g) * 8 + 1e-3)
    x[0, 0] = 0.0  # an all-zero vector: the smallest scale
    if T > 1:
        x[1, 0, 0] = 3e4  # one outlier dominates its vector
        x[1, 0, 1] = 0.5 * x[1, 0, 0] / 127 * 3  # lands near a rounding tie of the int8 grid
    return x.to(device, torch.bfloat16)

def check(kv_dtype, device, paged, D):
    H, B, blocks = 3, 8, 6
    NG = 2 if D == 64 else 1  # kv_dtypes.scale_groups
    dtype = kv_quant.STORAGE[kv_dtype]
    values = torch.zeros(blocks, H, B, D, dtype=dtype, device=device)
    scales = torch.ones(blocks, H, B, NG, dtype=torch.float16, device=device)
    T = 11
    x = inputs(T, H, D, 1, device)
    pos = torch.tensor([0, 1, 2, 7, 8, 9, 15, 16, 23, 30, 31], device=device)
    if paged:  # logical block i lives in physical block table[i]
        table = torch.tensor([4, 0, 5, 2], dtype=torch.int32, device=device)
        kv_write_kernel.quantize_store(values, scales, table, pos, x)
        where = table[pos // B].long(), pos % B
    else:  # one block of blocks * B slots
        values = values.view(1, H, blocks * B, D)
        scales = scales.view(1, H, blocks * B, NG)
        kv_write_kernel.quantize_store(values, scales, None, pos, x)
        where = torch.zeros_like(pos), pos
    q, s = kv_quant.quantize(x, dtype)  # [T, H, D], [T, H, NG]
    assert s.shape == (T, H, NG)
    got_q = values[where[0], :, where[1]]  # [T, H, D]
    got_s = scales[where[0], :, where[1]]  # [T, H, NG]
    assert torch.equal(got_s, s), (got_s - s).abs().max()
    if dtype is not torch.int8:
        got_q, q = got_q.view(torch.uint8), q.view(torch.uint8)
    bad = (got_q != q).sum().item()
    assert bad == 0, f"{kv_dtype} paged={paged}: {bad} codes differ"
    untouched = torch.ones(values.shape[:3], dtype=torch.bool, device=device)
    untouched[where[0], :, where[1]] = False
    assert (scales[untouched] == 1).all(), "a slot not written was changed"

device = sys.argv[1]
for kv_dtype in sys.argv[2:]:
    for paged, D in ((False, 64), (True, 64), (True, 48)):
        check(kv_dtype, device, paged, D)
print("ok")
"""


def test_fused_write_in_the_interpreter():
    """int8 in Triton's interpreter (CPU): TRITON_INTERPRET is read when Triton is imported,
    hence a process of its own. (fp8 conversions are the GPU's: checked on the device.)"""
    pytest.importorskip("triton")
    env = dict(os.environ, TRITON_INTERPRET="1",
               PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]))
    proc = subprocess.run([sys.executable, "-c", CHECK, "cpu", "int8"], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0 and "ok" in proc.stdout, proc.stderr[-3000:]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_fused_write_on_the_gpu():
    kinds = ["int8"] + (["fp8"] if torch.cuda.get_device_capability() >= (8, 9) else [])
    if not all(attention_backend.kernel_reads(torch.device("cuda"), k) for k in kinds):
        pytest.skip("the Triton kernels do not run here")
    proc = subprocess.run([sys.executable, "-c", CHECK, "cuda", *kinds], cwd=REPO,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0 and "ok" in proc.stdout, proc.stderr[-3000:]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_the_arena_takes_the_fused_write_where_the_kernel_reads():
    """kv_arena.store on a GPU: the fused launch and the PyTorch ops write the same bytes
    through a block table."""
    dev = torch.device("cuda")
    if not attention_backend.kernel_reads(dev, "int8"):
        pytest.skip("the Triton kernels do not run here")
    assert KVCache(1, 4, 128, 16, "int8", dev).fused_writes
    x = torch.randn(1, 4, 5, 128, device=dev, dtype=torch.bfloat16) * 3  # [1, H_kv, T, D]
    pos = torch.tensor([3, 4, 5, 6, 9], device=dev)
    table = torch.tensor([2, 0, 1], dtype=torch.int32, device=dev)  # blocks of 4 slots
    fused = torch.zeros(3, 4, 4, 128, dtype=torch.int8, device=dev)
    fused_s = torch.ones(3, 4, 4, 4, dtype=torch.float16, device=dev)
    kv_arena.store(fused, fused_s, table, pos, x, fused=True)
    q, s = kv_quant.quantize(x[0].transpose(0, 1), torch.int8)  # [T, H_kv, D], [T, H_kv, 4]
    blocks, slots = table[pos // 4].long(), pos % 4
    ref, ref_s = torch.zeros_like(fused), torch.ones_like(fused_s)
    ref[blocks, :, slots], ref_s[blocks, :, slots] = q, s
    assert torch.equal(fused, ref) and torch.equal(fused_s, ref_s)
