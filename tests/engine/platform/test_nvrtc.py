"""platform/nvrtc.py: kernels compiled by NVRTC, launched through one parameter block each. On the
CPU: the block the driver is handed points at each argument's value (a tensor's pointer, an
int), and bad kinds or argument counts are refused. On a GPU: a compiled kernel computes what
torch does, on the current stream, eagerly and in a captured graph, and from several threads."""

from __future__ import annotations

import ctypes
import threading

import pytest
import torch

from engine.platform import nvrtc
from tests.engine.helpers import captured

CUDA = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


class _Compiled:
    func = ctypes.c_void_p(0xABC0)


def test_each_launch_hands_the_driver_the_arguments_values(monkeypatch):
    seen = []

    def launch(func, gx, gy, gz, bx, by, bz, shared, stream, params, extra):
        p = ctypes.cast(params, ctypes.POINTER(ctypes.c_void_p))
        seen.append(((func.value, gx, gy, gz, bx, by, bz, shared, stream, extra),
                     ctypes.cast(p[0], ctypes.POINTER(ctypes.c_void_p))[0],
                     ctypes.cast(p[1], ctypes.POINTER(ctypes.c_int))[0],
                     ctypes.cast(p[2], ctypes.POINTER(ctypes.c_int))[0]))
        return 0

    monkeypatch.setattr(nvrtc, "_launch", lambda: launch)
    streams = []
    monkeypatch.setattr(torch._C, "_cuda_getCurrentRawStream",
                        lambda device: streams.append(device) or 77, raising=False)
    kernel = nvrtc.Kernel(_Compiled(), "pii", device_index=3)
    a, b = torch.zeros(3), torch.zeros(5)
    kernel(grid=(4, 2, 1), block=(256, 1, 1), args=[a, 9, -3])
    kernel(grid=(1, 1, 1), block=(32, 1, 1), args=[b, 2 ** 31 - 1, 0])
    assert seen == [((0xABC0, 4, 2, 1, 256, 1, 1, 0, 77, None), a.data_ptr(), 9, -3),
                    ((0xABC0, 1, 1, 1, 32, 1, 1, 0, 77, None), b.data_ptr(), 2 ** 31 - 1, 0)]
    assert streams == [3, 3]  # the current stream of the kernel's own device


def test_a_failed_launch_raises_and_bad_arguments_are_refused(monkeypatch):
    monkeypatch.setattr(nvrtc, "_launch", lambda: lambda *a: 700)
    monkeypatch.setattr(torch._C, "_cuda_getCurrentRawStream", lambda device: 0, raising=False)
    kernel = nvrtc.Kernel(_Compiled(), "pi")
    with pytest.raises(RuntimeError, match="CUDA error 700"):
        kernel(grid=(1, 1, 1), block=(1, 1, 1), args=[torch.zeros(1), 1])
    with pytest.raises(TypeError, match="takes 2 arguments, not 1"):
        kernel(grid=(1, 1, 1), block=(1, 1, 1), args=[torch.zeros(1)])
    with pytest.raises(ValueError, match="kinds"):
        nvrtc.Kernel(_Compiled(), "pf")


_AXPY = r"""
extern "C" __global__ void axpy(const float* x, float* y, int n, int a) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] += a * x[i];
}
"""


@CUDA
def test_a_compiled_kernel_runs_eagerly_in_a_graph_and_from_threads():
    kernel = nvrtc.compiled("axpy", _AXPY, "ppii", torch.cuda.current_device())
    assert nvrtc.compiled("axpy", _AXPY, "ppii", torch.cuda.current_device()) is kernel
    n = 1000
    x = torch.randint(-1000, 1000, (n,), device="cuda").float()  # sums of these are exact
    y = torch.zeros(n, device="cuda")
    kernel(grid=(4, 1, 1), block=(256, 1, 1), args=[x, y, n, 3])
    torch.testing.assert_close(y, 3 * x, rtol=0, atol=0)

    def step():
        kernel(grid=(4, 1, 1), block=(256, 1, 1), args=[x, y, n, 2])
        return y

    graph, _ = captured(step)  # the warm-up adds 2 x once more
    torch.testing.assert_close(y, 5 * x, rtol=0, atol=0)
    for _ in range(2):
        graph.replay()
    torch.cuda.synchronize()
    torch.testing.assert_close(y, 9 * x, rtol=0, atol=0)

    ys = [torch.zeros(n, device="cuda") for _ in range(4)]

    def many(i: int) -> None:
        for _ in range(50):
            kernel(grid=(4, 1, 1), block=(256, 1, 1), args=[x, ys[i], n, i + 1])

    threads = [threading.Thread(target=many, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    torch.cuda.synchronize()
    for i in range(4):
        torch.testing.assert_close(ys[i], 50 * (i + 1) * x, rtol=0, atol=0)


def test_a_thread_without_a_context_gets_the_devices_and_launches_again(monkeypatch):
    results, made = [201, 0], []
    monkeypatch.setattr(nvrtc, "_launch", lambda: lambda *a: results.pop(0))
    monkeypatch.setattr(nvrtc, "_make_context_current", made.append)
    monkeypatch.setattr(torch._C, "_cuda_getCurrentRawStream", lambda device: 0, raising=False)
    nvrtc.Kernel(_Compiled(), "i", device_index=2)(grid=(1, 1, 1), block=(1, 1, 1), args=[5])
    assert made == [2] and results == []


def test_a_dependent_launch_hands_the_driver_a_config_with_the_attribute(monkeypatch):
    """cuLaunchKernelEx's CUlaunchConfig and CUlaunchAttribute as cuda.h lays them out (x86-64),
    the grid, block and stream of each launch written into the one config."""
    assert ctypes.sizeof(nvrtc._Attribute) == 72  # an id padded to 8, a 64-byte union
    assert nvrtc._Attribute.value.offset == 8
    assert [getattr(nvrtc._Config, f).offset for f in ("block", "shared", "stream", "attrs",
                                                       "num_attrs")] == [12, 24, 32, 40, 48]
    assert ctypes.sizeof(nvrtc._Config) == 56
    seen = []

    def launch_ex(config, func, params, extra):
        c = config._obj
        a = c.attrs[0]
        p = ctypes.cast(params, ctypes.POINTER(ctypes.c_void_p))
        seen.append((tuple(c.grid), tuple(c.block), c.shared, c.stream, c.num_attrs, a.id,
                     a.value, func.value, ctypes.cast(p[0], ctypes.POINTER(ctypes.c_int))[0],
                     extra))
        return 0

    monkeypatch.setattr(nvrtc, "_launch_ex", lambda: launch_ex)
    monkeypatch.setattr(nvrtc, "_launch", lambda: pytest.fail("a dependent's plain launch"))
    monkeypatch.setattr(torch._C, "_cuda_getCurrentRawStream", lambda device: 55, raising=False)
    kernel = nvrtc.Kernel(_Compiled(), "i", pdl=True)
    kernel(grid=(7, 1, 2), block=(128, 1, 1), args=[4])
    kernel(grid=(1, 3, 1), block=(32, 2, 1), args=[-1])
    assert seen == [((7, 1, 2), (128, 1, 1), 0, 55, 1, 6, 1, 0xABC0, 4, None),
                    ((1, 3, 1), (32, 2, 1), 0, 55, 1, 6, 1, 0xABC0, -1, None)]


def test_pdl_is_auto_products_or_off_as_the_load_set_it(monkeypatch):
    """The load's Backends.pdl (HEARTH_PDL read once, config/overrides.py), not the
    environment at each launch."""
    monkeypatch.setattr(nvrtc, "_pdl", "auto")
    monkeypatch.setenv("HEARTH_PDL", "off")  # read at a load, never here
    assert nvrtc.pdl_mode() == "auto"
    for mode in ("products", "off", "auto"):
        nvrtc.use_pdl(mode)
        assert nvrtc.pdl_mode() == mode
    nvrtc.use_pdl("off")
    assert not nvrtc.pdl_wanted(0)  # without asking the device
    with pytest.raises(ValueError, match="pdl must be one of auto, products, off, not 'on'"):
        nvrtc.use_pdl("on")
    nvrtc.use_pdl("auto")
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda i: (8, 9))
    assert not nvrtc.pdl_wanted(0)  # an RTX 4090: no griddepcontrol
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda i: (12, 0))
    assert nvrtc.pdl_wanted(0)
