"""Developer overrides: the only place the engine reads HEARTH_* settings from the environment.
Read once per load (a session's EngineConfig holds what they said); docs/configuration.md is
their table. Anything else is configuration that travels with a request, never the environment.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping

from engine.config.backends import (
    ALL,
    INT4_KERNELS,
    Backends,
    launch_pairs,
)
from engine.config.backends import (
    DECODE_ATTENTION as DECODE_ATTENTION_SETTINGS,
)
from engine.config.backends import (
    FUSED_OPS as FUSED_OPS_SETTINGS,
)
from engine.config.backends import (
    TP_ALL_REDUCE as TP_ALL_REDUCE_SETTINGS,
)

DECODE_ATTENTION = "HEARTH_DECODE_ATTENTION"  # auto | triton | sdpa | reference
DECODE_ATTENTION_CONFIG = "HEARTH_DECODE_ATTENTION_CONFIG"  # JSON over the kernel's CONFIGS
KERNEL_PREFILL = "HEARTH_KERNEL_PREFILL"  # tokens, or "all"
FUSED_OPS = "HEARTH_FUSED_OPS"  # auto | off
INT4_KERNEL = "HEARTH_INT4_KERNEL"  # mma | tinygemm | triton | cpu | reference
TP_ALL_REDUCE = "HEARTH_TP_ALL_REDUCE"  # auto | nccl
INT4_PREFILL = "HEARTH_INT4_PREFILL"  # fused | unpack: how many-row products read tinygemm's layout
INT4_ROWS = "HEARTH_INT4_ROWS"  # fixed | measure: from how many rows the GEMM takes over
PREFILL_GRAPHS = "HEARTH_PREFILL_GRAPHS"  # on | off: prefill chunks replayed as CUDA graphs
PDL = "HEARTH_PDL"  # auto | products | off: programmatic dependent launch (platform/nvrtc.py)
DEBUG = "HEARTH_DEBUG"  # 1: third-party notes and full tracebacks
TP_FOLLOWER_HOOK = "HEARTH_TP_FOLLOWER_HOOK"  # tests: "module:function" a follower calls first
NAMES = (DECODE_ATTENTION, DECODE_ATTENTION_CONFIG, KERNEL_PREFILL, FUSED_OPS, INT4_KERNEL,
         TP_ALL_REDUCE, INT4_PREFILL, INT4_ROWS, PREFILL_GRAPHS, PDL, DEBUG, TP_FOLLOWER_HOOK)


def backends(environ: Mapping[str, str] | None = None) -> Backends:
    """The backend settings the environment overrides (unset: Backends' defaults). A value
    that is not understood raises ValueError naming its variable."""
    env = os.environ if environ is None else environ
    return Backends(
        decode_attention=_choice(env, DECODE_ATTENTION, DECODE_ATTENTION_SETTINGS, "auto"),
        decode_attention_launch=_launch(env.get(DECODE_ATTENTION_CONFIG, "")),
        kernel_prefill=_kernel_prefill(env.get(KERNEL_PREFILL, "")),
        fused_ops=_choice(env, FUSED_OPS, FUSED_OPS_SETTINGS, "auto"),
        int4_kernel=_choice(env, INT4_KERNEL, INT4_KERNELS, None),
        tp_all_reduce=_choice(env, TP_ALL_REDUCE, TP_ALL_REDUCE_SETTINGS, "auto"))


def int4_prefill(environ: Mapping[str, str] | None = None) -> str:
    """"fused" (the Triton GEMM over tinygemm's layout, where it checks out) or "unpack" (the
    layer unpacked to 16 bits, then a dense matmul), for products of more than 64 rows."""
    env = os.environ if environ is None else environ
    return _choice(env, INT4_PREFILL, ("fused", "unpack"), "fused")


def int4_rows(environ: Mapping[str, str] | None = None) -> str:
    """"measure" (the Triton GEMM takes int4 products from 16, 32 or 64 rows, per layer shape,
    as timed at load: quant/int4_rows.py) or "fixed" (above 64 rows only, as before)."""
    env = os.environ if environ is None else environ
    return _choice(env, INT4_ROWS, ("fixed", "measure"), "measure")


def prefill_graphs(environ: Mapping[str, str] | None = None) -> str:
    """"on" (prefill chunks up to step/prefill_graphs.MAX_TOKENS replay as CUDA graphs, where
    the decode step is captured) or "off" (they run eagerly)."""
    env = os.environ if environ is None else environ
    return _choice(env, PREFILL_GRAPHS, ("on", "off"), "on")


def pdl(environ: Mapping[str, str] | None = None) -> str:
    """"auto" (on Hopper on, the int4 decode products and the Triton pieces of few-token steps
    launch as programmatic dependents), "products" (the products only) or "off"."""
    env = os.environ if environ is None else environ
    return _choice(env, PDL, ("auto", "products", "off"), "auto")


def debug(environ: Mapping[str, str] | None = None) -> bool:
    env = os.environ if environ is None else environ
    return env.get(DEBUG, "").strip().lower() in ("1", "true", "yes")


def follower_hook(environ: Mapping[str, str] | None = None):
    """The function a tensor-parallel follower calls with its rank before it joins (tests put
    their fault injection there, tests/engine/parallel/faults.py); None when unset."""
    env = os.environ if environ is None else environ
    where = env.get(TP_FOLLOWER_HOOK, "")
    if not where:
        return None
    module, sep, name = where.partition(":")
    if not sep or not module or not name:
        raise ValueError(f"{TP_FOLLOWER_HOOK} must be module:function, not {where!r}")
    import importlib

    return getattr(importlib.import_module(module), name)


def _choice(env: Mapping[str, str], name: str, choices: tuple[str, ...], default):
    value = env.get(name) or default
    if value is not None and value not in choices:
        how = " or ".join(choices) if len(choices) == 2 else f"one of {', '.join(choices)}"
        raise ValueError(f"{name} must be {how}, not {value!r}")
    return value


def _kernel_prefill(text: str) -> int | str | None:
    if not text:
        return None
    if text == ALL:
        return ALL
    if not text.isdigit():
        raise ValueError(f"{KERNEL_PREFILL} must be a number of tokens or all, not {text!r}")
    return int(text)


def _launch(text: str) -> tuple[tuple[str, object], ...]:
    if not text:
        return ()
    try:
        settings = json.loads(text)
    except ValueError:
        settings = None
    if not isinstance(settings, dict):
        raise ValueError(f"{DECODE_ATTENTION_CONFIG} must be a JSON object, not {text!r}")
    return launch_pairs(settings)
