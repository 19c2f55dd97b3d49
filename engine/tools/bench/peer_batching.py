"""The peer beside `hearth bench --concurrency`: transformers' own continuous batching
(`model.generate_batch`, transformers >= 5) on the same model and prompts, timed from its own
per-token timestamps, so its warm-up (CUDA graph capture) is left out. Not the engine.
"""

from __future__ import annotations

import dataclasses
import logging
import math
from collections.abc import Callable
from dataclasses import asdict

import torch

from engine.attention import prefill as attention
from engine.tools.bench.timing import Round, Timing, median_round, summarize


def _settings(device: torch.device, num_prompts: int, prompt_len: int, new_tokens: int,
              fields: set[str]) -> dict:
    """Its best settings here. On CUDA: graphs on, the rest sized by transformers from free
    memory. On the CPU it would size its static tensors from RAM (seconds of fills a call),
    so they are sized from the workload instead."""
    if device.type == "cuda":
        settings = {"use_cuda_graph": True}
    else:
        page = 256  # its default page (5.17 calls it block_size, 5.24 page_size)
        pages = math.ceil((prompt_len + new_tokens) / page)
        settings = {"num_blocks": num_prompts * pages + 1,
                    "max_batch_tokens": min(num_prompts * prompt_len + num_prompts, 4096)}
    return {k: v for k, v in settings.items() if k in fields}


def _round(model, prompts: list[list[int]], new_tokens: int, gen_config, cb_fields: set[str],
           device: torch.device, keep: bool = False) -> Round:
    """One generate_batch call; `keep`: its manager (and CUDA graphs) serve the next call."""
    from transformers.generation.configuration_utils import ContinuousBatchingConfig

    settings = _settings(device, len(prompts), len(prompts[0]), new_tokens, cb_fields)
    out = model.generate_batch(prompts, generation_config=gen_config,
                               continuous_batching_config=ContinuousBatchingConfig(**settings),
                               record_timestamps=True, max_new_tokens=new_tokens,
                               persistent_manager=keep)
    results = list(out.values())
    if len(results) != len(prompts):  # it logs and returns what it has when its thread dies
        raise RuntimeError(f"{len(prompts) - len(results)} of {len(prompts)} requests "
                           "returned no result")
    timings = []
    for r in results:
        if r.error is not None:
            raise RuntimeError(r.error)
        if len(r.generated_tokens) != new_tokens or not r.timestamps:
            raise RuntimeError(f"a request returned {len(r.generated_tokens)} tokens, not "
                               f"{new_tokens}")
        timings.append(Timing(r.created_time, list(r.timestamps), r.timestamps[-1], "finished"))
    # created_time: when add_requests took it, after the warm-up; the clock is perf_counter
    return summarize(timings, min(t.submit_s for t in timings))


def _one_line(e: BaseException) -> str:
    text = " ".join(str(e).split()) or type(e).__name__
    return f"{type(e).__name__}: {text[:300]}"


def measure(model, device: torch.device, concurrency: list[int],
            prompts: Callable[[int], list[list[int]]], prompt_len: int, new_tokens: int,
            repeats: int) -> dict:
    """{"transformers", "settings", "rows"} or {"unavailable": why}; a row that could not run
    says why in "not_run", never a number it did not measure."""
    import transformers

    version = transformers.__version__
    if not hasattr(model, "generate_batch"):
        return {"transformers": version,
                "unavailable": f"transformers {version} has no generate_batch (it came in 5.x)"}
    from transformers import GenerationConfig
    from transformers.generation.configuration_utils import ContinuousBatchingConfig

    cb_fields = {f.name for f in dataclasses.fields(ContinuousBatchingConfig)}
    # greedy, no eos: every request runs to new_tokens, as the engine's do (ignore_eos)
    gen_config = GenerationConfig(do_sample=False, eos_token_id=-1, pad_token_id=0,
                                  max_new_tokens=new_tokens)
    model.set_attn_implementation("sdpa")  # its paged attention wraps sdpa
    log = logging.getLogger("ContinuousBatchingLogger")
    level = log.level
    log.setLevel(logging.ERROR)  # its warning at every kept manager, and the sizing chatter
    rows: list[dict] = []
    try:
        try:
            _round(model, prompts(1), 2, gen_config, cb_fields, device)  # lazy init, kernels
        except Exception as e:
            return {"transformers": version, "unavailable": f"generate_batch failed: "
                                                            f"{_one_line(e)}"}
        for n in concurrency:
            # one manager per N, sized for that workload: the repeats reuse its CUDA graphs, so
            # the median leaves out graphs first captured in the first round
            try:
                rounds = [_round(model, prompts(n), new_tokens, gen_config, cb_fields, device,
                                 keep=True) for _ in range(repeats)]
                rows.append(asdict(median_round(rounds)))
            except Exception as e:  # out of memory at a large N, say: the row says so
                rows.append({"concurrency": n, "not_run": _one_line(e)})
            finally:
                model.destroy_cached_continuous_batching_manager()
                if device.type == "cuda":
                    torch.cuda.empty_cache()
    finally:
        model.set_attn_implementation(attention.ATTN_IMPLEMENTATION)  # the engine's, again
        log.setLevel(level)
    n = max(concurrency)
    settings = {**_settings(device, n, prompt_len, new_tokens, cb_fields),
                "sized_for": "transformers' own, from free memory" if device.type == "cuda"
                else f"the workload (shown at N={n})",
                "warm_up": "excluded (timed from each request's created_time)",
                "manager": "one per N, kept across the repeats"}
    return {"transformers": version, "settings": settings, "rows": rows}
