"""CUDA C++ kernels compiled at run time by NVRTC (torch.cuda._compile_kernel: torch's CUDA wheels
ship libnvrtc, so no nvcc or host compiler) and launched with little host work.

torch's own launcher opens libcuda, makes a ctypes array type and converts every argument on each
call: about a third of a 7B AWQ prefill's host time, and an eager prefill is bound by its
host. A Kernel here fixes its
argument kinds once, keeps one parameter block and writes the values into it at each launch;
cuLaunchKernel copies the parameters before it returns, so the block is free again at once.

A kernel may also be launched as a programmatic dependent launch (Hopper on: `pdl`): its blocks
start while the kernel before it in the stream finishes (once all of that kernel's blocks have
executed `griddepcontrol.launch_dependents`, or exited), and must execute `griddepcontrol.wait`
before reading what that kernel wrote or writing anything: about 4 us off each 7B decode layer
(docs/benchmark-log.md).
The load's `pdl` setting (config/backends.py, HEARTH_PDL) "off" launches every kernel
plainly (kernels/fused_ops_kernel.py pdl_options: the Triton pieces' side).
"""

from __future__ import annotations

import ctypes
import functools
import threading

import torch

from engine.config.backends import PDL

_pdl = "auto"  # the load's setting (use_pdl): one per process, as its kernels are


@functools.cache
def _launch():
    """The driver's cuLaunchKernel with its argument types set (the library torch loaded)."""
    from torch.cuda._utils import _get_gpu_runtime_library

    f = _get_gpu_runtime_library().cuLaunchKernel
    f.argtypes = ([ctypes.c_void_p] + [ctypes.c_uint] * 7
                  + [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p])
    f.restype = ctypes.c_int
    return f


PDL_ATTRIBUTE = 6  # CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION


class _Attribute(ctypes.Structure):  # CUlaunchAttribute: an id, padding, a 64-byte union
    _fields_ = [("id", ctypes.c_int), ("pad", ctypes.c_char * 4), ("value", ctypes.c_int),
                ("rest", ctypes.c_char * 60)]


class _Config(ctypes.Structure):  # CUlaunchConfig
    _fields_ = [("grid", ctypes.c_uint * 3), ("block", ctypes.c_uint * 3),
                ("shared", ctypes.c_uint), ("stream", ctypes.c_void_p),
                ("attrs", ctypes.POINTER(_Attribute)), ("num_attrs", ctypes.c_uint)]


@functools.cache
def _launch_ex():
    """The driver's cuLaunchKernelEx (CUDA 12.0 on), for launches with attributes."""
    from torch.cuda._utils import _get_gpu_runtime_library

    f = _get_gpu_runtime_library().cuLaunchKernelEx
    f.argtypes = [ctypes.POINTER(_Config), ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p]
    f.restype = ctypes.c_int
    return f


def use_pdl(mode: str) -> None:
    """Set at load from the session's Backends.pdl, before its kernels compile or launch."""
    global _pdl
    if mode not in PDL:
        raise ValueError(f"pdl must be one of {', '.join(PDL)}, not {mode!r}")
    _pdl = mode


def pdl_mode() -> str:
    """The load's pdl setting: "auto" (the int4 decode products and the Triton pieces between
    them launch as programmatic dependents), "products" (the products only) or "off"."""
    return _pdl


def pdl_wanted(device_index: int) -> bool:
    """Whether the int4 decode products (kernels that wait for their inputs: griddepcontrol)
    launch as programmatic dependents on this device: compute capability 9.0 on, unless off."""
    return pdl_mode() != "off" and torch.cuda.get_device_capability(device_index)[0] >= 9


class Kernel:
    """One compiled kernel whose parameters are `kinds`, one letter each: "p" a tensor (its
    device pointer), "i" a 32-bit int. Called as torch's: kernel(grid=, block=, args=)."""

    def __init__(self, compiled, kinds: str, device_index: int = 0, pdl: bool = False):
        if set(kinds) - {"p", "i"}:
            raise ValueError(f"parameter kinds are p (tensor) or i (int), not {kinds!r}")
        self._func = ctypes.c_void_p(compiled.func.value)
        self.pdl = pdl
        # cuLaunchKernelEx's config: its grid, block and stream written at each launch
        self._attr = _Attribute(id=PDL_ATTRIBUTE, value=1)
        self._config = _Config(attrs=ctypes.pointer(self._attr), num_attrs=1)
        self._kinds, self._device = kinds, device_index
        self._slots = [ctypes.c_void_p() if k == "p" else ctypes.c_int() for k in kinds]
        self._params = (ctypes.c_void_p * len(kinds))(
            *(ctypes.addressof(s) for s in self._slots))
        self._lock = threading.Lock()  # one parameter block: one launch at a time

    def __call__(self, grid: tuple[int, int, int], block: tuple[int, int, int],
                 args: list) -> None:
        if len(args) != len(self._kinds):
            raise TypeError(f"the kernel takes {len(self._kinds)} arguments, not {len(args)}")
        stream = torch._C._cuda_getCurrentRawStream(self._device)  # a graph capture's too
        # (torch.cuda.current_stream() makes a Stream object: as slow as the launch itself)
        with self._lock:
            for slot, kind, a in zip(self._slots, self._kinds, args, strict=True):
                slot.value = a.data_ptr() if kind == "p" else a
            err = self._launch(grid, block, stream)
            if err == INVALID_CONTEXT:  # a thread whose first CUDA call this is
                _make_context_current(self._device)
                err = self._launch(grid, block, stream)
        if err:
            raise RuntimeError(f"cuLaunchKernel failed: CUDA error {err}")

    def _launch(self, grid, block, stream) -> int:
        if self.pdl:
            c = self._config
            c.grid[0], c.grid[1], c.grid[2] = grid
            c.block[0], c.block[1], c.block[2] = block
            c.stream = stream
            return _launch_ex()(ctypes.byref(c), self._func, self._params, None)
        return _launch()(self._func, grid[0], grid[1], grid[2], block[0], block[1], block[2], 0,
                         stream, self._params, None)


INVALID_CONTEXT = 201  # CUDA_ERROR_INVALID_CONTEXT


def _make_context_current(device_index: int) -> None:
    """The device's primary context (torch's) made current in this thread, as torch's runtime
    calls do on their first use in a thread and the driver's cuLaunchKernel does not."""
    from torch.cuda._utils import _get_gpu_runtime_library

    lib, dev, ctx = _get_gpu_runtime_library(), ctypes.c_int(), ctypes.c_void_p()
    steps = (lambda: lib.cuDeviceGet(ctypes.byref(dev), device_index),
             lambda: lib.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev),
             lambda: lib.cuCtxSetCurrent(ctx))
    for step in steps:  # each after the one before succeeded
        err = step()
        if err:
            raise RuntimeError(f"no CUDA context for device {device_index}: CUDA error {err}")


def compiled(name: str, source: str, kinds: str, device_index: int, pdl: bool = False
             ) -> Kernel:
    """`name` in `source` compiled for device `device_index` (once per process and launch
    kind); `pdl`: launched as a programmatic dependent where the device has it (pdl_wanted)."""
    return _compiled(name, source, kinds, device_index, pdl and pdl_wanted(device_index))


@functools.cache
def _compiled(name: str, source: str, kinds: str, device_index: int, pdl: bool) -> Kernel:
    with torch.cuda.device(device_index):
        return Kernel(torch.cuda._compile_kernel(source, name), kinds, device_index, pdl)
