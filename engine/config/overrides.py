"""Developer overrides: the only place the engine reads HEARTH_* settings from the environment.
Read once per load, into the Backends a session's EngineConfig holds (code below config/ takes
them from there, never from the environment); docs/configuration.md is their table. Anything
else is configuration that travels with a request, never the environment.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping

from engine.config import backends as settings
from engine.config.backends import ALL, Backends, launch_pairs

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
        decode_attention=_choice(env, DECODE_ATTENTION, settings.DECODE_ATTENTION, "auto"),
        decode_attention_launch=_launch(env.get(DECODE_ATTENTION_CONFIG, "")),
        kernel_prefill=_kernel_prefill(env.get(KERNEL_PREFILL, "")),
        fused_ops=_choice(env, FUSED_OPS, settings.FUSED_OPS, "auto"),
        int4_kernel=_choice(env, INT4_KERNEL, settings.INT4_KERNELS, None),
        tp_all_reduce=_choice(env, TP_ALL_REDUCE, settings.TP_ALL_REDUCE, "auto"),
        int4_prefill=_choice(env, INT4_PREFILL, settings.INT4_PREFILL, "fused"),
        int4_rows=_choice(env, INT4_ROWS, settings.INT4_ROWS, "measure"),
        prefill_graphs=_choice(env, PREFILL_GRAPHS, settings.PREFILL_GRAPHS, "on"),
        pdl=_choice(env, PDL, settings.PDL, "auto"))


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
