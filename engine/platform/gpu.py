"""Every NVIDIA GPU, read through NVML (nvidia-ml-py); no GPU is a normal answer.

NVML is the driver's management library: reading it creates no CUDA context (torch's
`mem_get_info()` would cost ~0.5 GiB of the card and seconds of start-up), so the Qt app and the
telemetry panel can call this freely. `pynvml` is imported inside the functions, so importing this
module never fails, and torch is never imported here.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass

CPU_MODE = "CPU mode"


@dataclass(frozen=True)
class GpuInfo:
    index: int  # NVML index: PCI bus order (CUDA's differs unless CUDA_DEVICE_ORDER=PCI_BUS_ID)
    name: str
    uuid: str
    total_bytes: int
    free_bytes: int
    used_bytes: int  # device-wide, all processes (display server, browsers, other engines)
    compute_capability: tuple[int, int]
    driver_version: str
    supports_bf16: bool  # Ampere (8.0) and later
    supports_fp8: bool  # Ada (8.9) and Hopper: fp8 tensor cores, so an fp8 KV cache is native

    def to_dict(self) -> dict:
        d = asdict(self)
        d["compute_capability"] = list(self.compute_capability)
        return d


@dataclass(frozen=True)
class GpuReport:
    gpus: tuple[GpuInfo, ...]
    reason: str | None = None  # plain words when there is no GPU, or a GPU could not be read

    @property
    def cpu_mode(self) -> bool:
        return not self.gpus

    def to_dict(self) -> dict:
        return {"gpus": [g.to_dict() for g in self.gpus], "reason": self.reason,
                "cpu_mode": self.cpu_mode}


def _text(value) -> str:
    # older pynvml releases return bytes, newer ones str
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)


def _reason(pynvml, exc: Exception) -> str:
    """One sentence for why NVML cannot be used; ends by naming CPU mode."""
    def kind(name: str) -> bool:
        cls = getattr(pynvml, name, None)
        return isinstance(cls, type) and isinstance(exc, cls)

    if kind("NVMLError_LibraryNotFound"):
        why = "no NVIDIA driver is installed (the NVML library was not found)"
    elif kind("NVMLError_DriverNotLoaded"):
        why = "the NVIDIA driver is installed but not loaded"
    elif kind("NVMLError_NoPermission"):
        why = "this user may not read the NVIDIA driver (no permission)"
    elif kind("NVMLError_LibRmVersionMismatch"):
        why = "the NVIDIA driver and its library versions differ (reboot after a driver update)"
    else:
        why = f"the NVIDIA driver could not be read ({_text(exc) or type(exc).__name__})"
    return f"{why}; {CPU_MODE}"


@contextmanager
def _nvml(pynvml) -> Iterator[None]:
    pynvml.nvmlInit()
    try:
        yield
    finally:
        try:
            pynvml.nvmlShutdown()
        except pynvml.NVMLError:
            pass  # a failed shutdown leaves nothing for us to clean up


def _read_gpu(pynvml, index: int, driver: str) -> GpuInfo:
    handle = pynvml.nvmlDeviceGetHandleByIndex(index)
    mem = pynvml.nvmlDeviceGetMemoryInfo(handle)
    major, minor = pynvml.nvmlDeviceGetCudaComputeCapability(handle)
    cc = (int(major), int(minor))
    try:
        uuid = _text(pynvml.nvmlDeviceGetUUID(handle))
    except pynvml.NVMLError:
        uuid = ""  # some vGPU / MIG setups refuse it; the index still identifies the card
    return GpuInfo(index=index, name=_text(pynvml.nvmlDeviceGetName(handle)), uuid=uuid,
                   total_bytes=int(mem.total), free_bytes=int(mem.free), used_bytes=int(mem.used),
                   compute_capability=cc, driver_version=driver,
                   supports_bf16=cc >= (8, 0), supports_fp8=cc >= (8, 9))


def detect_gpus() -> GpuReport:
    """All NVIDIA GPUs NVML sees. Never raises: no driver or no GPU gives an empty report."""
    try:
        import pynvml
    except ImportError:
        return GpuReport((), f"nvidia-ml-py (pynvml) is not installed; {CPU_MODE}")
    try:
        with _nvml(pynvml):
            try:
                driver = _text(pynvml.nvmlSystemGetDriverVersion())
            except pynvml.NVMLError:
                driver = ""
            gpus, skipped = [], []
            for i in range(int(pynvml.nvmlDeviceGetCount())):
                try:
                    gpus.append(_read_gpu(pynvml, i, driver))
                except pynvml.NVMLError as e:  # a lost or busy card must not hide the others
                    skipped.append(f"GPU {i} could not be read ({_text(e)})")
    except (pynvml.NVMLError, OSError) as e:
        return GpuReport((), _reason(pynvml, e))
    if not gpus:
        found = "; ".join(skipped) if skipped else "the NVIDIA driver is loaded but sees no GPU"
        return GpuReport((), f"{found}; {CPU_MODE}")
    return GpuReport(tuple(gpus), "; ".join(skipped) or None)


def process_used_bytes(pid: int, index: int = 0) -> int | None:
    """GPU memory NVML charges to process `pid` on GPU `index`, CUDA context included.

    None when it cannot be known: no NVML, no such GPU, the process holds no CUDA context there,
    or the platform hides per-process figures (Windows WDDM, and containers, where NVML lists
    host PIDs that differ from the PIDs seen inside).
    """
    try:
        import pynvml
    except ImportError:
        return None
    try:
        with _nvml(pynvml):
            handle = pynvml.nvmlDeviceGetHandleByIndex(index)
            for proc in pynvml.nvmlDeviceGetComputeRunningProcesses(handle):
                if int(proc.pid) == pid:
                    used = getattr(proc, "usedGpuMemory", None)
                    # NVML_VALUE_NOT_AVAILABLE (2**64 - 1) where newer pynvml would say None
                    return int(used) if used is not None and used < 2**63 else None
    except (pynvml.NVMLError, OSError):
        return None
    return None
