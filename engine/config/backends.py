"""Backend settings: how a session's kernels run (decode attention, the kernel prefill bound, the
fused pieces, the int4 kernel and its prefill products, the tensor-parallel all-reduce, kernel
launch settings, prefill graphs). What was
asked, validated; the choice each one leads to on a device is made by the code that runs it.
Pure data (no torch): every layer that reads a setting may import it."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass

DECODE_ATTENTION = ("auto", "triton", "sdpa", "reference")
FUSED_OPS = ("auto", "off")
INT4_KERNELS = ("mma", "tinygemm", "triton", "cpu", "reference")
TP_ALL_REDUCE = ("auto", "nccl")
INT4_PREFILL = ("fused", "unpack")
INT4_ROWS = ("measure", "fixed")
PREFILL_GRAPHS = ("on", "off")
PDL = ("auto", "products", "off")
ALL = "all"  # kernel_prefill: any chunk, wherever it ends


@dataclass(frozen=True)
class Backends:
    """decode_attention: how decode steps read the KV cache ("auto": the Triton kernel where it
    runs). decode_attention_launch: (key, value) pairs over the kernel's launch CONFIGS
    (benchmark sweeps). kernel_prefill: the furthest position a prefill chunk may end at and
    still run the family step (tokens; "all"; None: the step's own bound). fused_ops: norms,
    SiLU * up and RoPE as Triton launches ("auto") or PyTorch pieces ("off"). int4_kernel: force
    one int4 kernel where it fits (None: the fastest that fits). tp_all_reduce: "auto" lets the
    ranks pick the fastest sum that checks out, "nccl" keeps NCCL's. int4_prefill: products of
    more than 64 rows over tinygemm's layout run the Triton GEMM ("fused", where it checks out)
    or unpack the layer to 16 bits ("unpack"). int4_rows: from how many rows that GEMM takes
    over, timed per layer shape at load on a GPU ("measure") or above 64 only ("fixed").
    prefill_graphs: prefill chunks replay as CUDA graphs where the decode step is captured
    ("on") or run eagerly ("off"). pdl: programmatic dependent launch on Hopper on: the int4
    decode products and the Triton pieces of few-token steps ("auto"), the products only
    ("products"), none ("off")."""

    decode_attention: str = "auto"
    decode_attention_launch: tuple[tuple[str, object], ...] = ()
    kernel_prefill: int | str | None = None
    fused_ops: str = "auto"
    int4_kernel: str | None = None
    tp_all_reduce: str = "auto"
    int4_prefill: str = "fused"
    int4_rows: str = "measure"
    prefill_graphs: str = "on"
    pdl: str = "auto"

    def __post_init__(self):
        _one_of("decode_attention", self.decode_attention, DECODE_ATTENTION)
        _one_of("fused_ops", self.fused_ops, FUSED_OPS)
        _one_of("tp_all_reduce", self.tp_all_reduce, TP_ALL_REDUCE)
        _one_of("int4_prefill", self.int4_prefill, INT4_PREFILL)
        _one_of("int4_rows", self.int4_rows, INT4_ROWS)
        _one_of("prefill_graphs", self.prefill_graphs, PREFILL_GRAPHS)
        _one_of("pdl", self.pdl, PDL)
        if self.int4_kernel is not None:
            _one_of("int4_kernel", self.int4_kernel, INT4_KERNELS)
        kp = self.kernel_prefill
        if kp is not None and kp != ALL and not (
                isinstance(kp, int) and not isinstance(kp, bool) and kp >= 0):
            raise ValueError(f"kernel_prefill must be a number of tokens or {ALL}, not {kp!r}")
        if not all(isinstance(p, tuple) and len(p) == 2 and isinstance(p[0], str)
                   for p in self.decode_attention_launch):
            raise ValueError("decode_attention_launch holds (name, value) pairs")

    @property
    def launch(self) -> dict | None:
        """The decode-attention kernel's launch overrides as a dict; None without any."""
        return dict(self.decode_attention_launch) or None

    def kernel_prefill_bound(self, default: int) -> int | float:
        """kernel_prefill as a bound on a chunk's end: `default` unless set, inf for "all"."""
        if self.kernel_prefill is None:
            return default
        return float("inf") if self.kernel_prefill == ALL else self.kernel_prefill

    def as_dict(self) -> dict:
        d = asdict(self)
        d["decode_attention_launch"] = dict(self.decode_attention_launch)
        return d

    def to_json(self) -> str:
        """For processes that build their own steps (tensor-parallel followers)."""
        return json.dumps(self.as_dict())

    @classmethod
    def from_json(cls, text: str) -> Backends:
        d = json.loads(text)
        d["decode_attention_launch"] = launch_pairs(d.get("decode_attention_launch") or {})
        return cls(**d)


def launch_pairs(settings: dict) -> tuple[tuple[str, object], ...]:
    """A launch-settings dict as Backends holds it (sorted: equal settings, equal configs)."""
    return tuple(sorted(settings.items()))


def _one_of(name: str, value, choices: tuple[str, ...]) -> None:
    if value not in choices:
        raise ValueError(f"{name} must be one of {', '.join(choices)}, not {value!r}")


DEFAULTS = Backends()  # every setting unset
