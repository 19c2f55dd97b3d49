"""The events a Session reports about itself: the Loaded event (its notes: the KV cache, the
decode path, how generations run together) and a generation's Stats."""

from __future__ import annotations

import os
import time

from engine.answer import reasoning
from engine.attention import paged
from engine.events import Failed, Loaded, Stats
from engine.formats import sampling_defaults
from engine.generate.prompt import template_text
from engine.plan.oom import out_of_memory
from engine.platform import telemetry


def batching_note(session) -> str:
    """How generations run on this session, for the load event and the benchmarks."""
    return ("continuous batching: generations run together, each joining and leaving "
            "at any step (a batch of one runs the single step; speculation too)")


def loaded(session) -> Loaded:
    """The Loaded event: what the load chose, in notes a reader can act on."""
    lm = session.lm
    kv = (f"KV cache: {session.kv_dtype} ({session.kv_reason}), "
          f"{session.cache.num_bytes / 2**20:,.1f} MiB for {session.cache.max_len:,} tokens"
          + (", its fp16 scales (one per 32 values of a head) included" if session.cache.quantized
             else "")
          + (f" ({session.cache.num_blocks * session.cache.block_size:,} tokens in all, shared "
             f"by the sequences that run together; {session.config.kv_tokens:,} asked)"
             if session.config.kv_tokens is not None else "")
          + f", in blocks of {session.cache.block_size} tokens"
          + (" that later conversations share by prefix" if session.cache.share_prefixes
             else ""))
    sampling = lm.sampling_defaults
    notes = (*lm.notes, kv, f"decode path: {session.decoder.mode}", batching_note(session),
             sampling_defaults.describe(sampling),
             paged.describe(session.cache),
             *([session.kernel_note] if session.kernel_note else []), *session.decoder.notes,
             session.config.summary())
    if session.draft is not None:
        d = session.draft
        notes += (f"speculative decoding with the draft {d.lm.folder.path} "
                  f"({d.lm.quant}, decode path: {d.decoder.mode})" + (
                      "" if session.config.reproducible else
                      "; greedy answers equal plain decoding's except where the top two "
                      "choices are close (exactly, with --reproducible on)"),)
    config = {**session.config.as_dict(), "decode_attention": paged.of(
        session.cache).name, "failed_kernels": session.cache.health.as_list()}
    template = template_text(lm.tokenizer)
    return Loaded(str(lm.folder.path), lm.folder.architecture, str(lm.device), lm.quant,
                  session.kv_dtype, lm.context, lm.weights_bytes, session.cache.num_bytes, notes,
                  os.getpid(), config, sampling, reasoning.thinks(template),
                  reasoning.can_stop(template))


def stats(session, ids, n_new, t_start, t_first, start, dropped, decoding=None) -> Stats:
    """A generation's Stats event so far."""
    now = time.perf_counter()
    prefilled = len(ids) - start
    ttft = (t_first - t_start) if t_first else 0.0
    decode_s = now - t_first if t_first else 0.0
    return Stats(
        prompt_tokens=len(ids),
        new_tokens=n_new,
        ttft_ms=round(ttft * 1000, 2),
        prefill_tokens_per_s=round(prefilled / ttft, 1) if ttft > 0 else 0.0,
        decode_tokens_per_s=round((n_new - 1) / decode_s, 2) if n_new > 1 and decode_s else 0.0,
        vram_used_bytes=telemetry.vram_used_bytes(session.lm.device),
        kv_cache_bytes=session.cache.num_bytes,
        context_used_tokens=len(ids) + n_new,
        cached_prompt_tokens=start,
        computed_prompt_tokens=prefilled,
        dropped_messages=dropped,
        pid=os.getpid(),
        **(decoding.stats() if decoding is not None else {}),
    )


def oom_failure(session, kind: str) -> Failed:
    """`kind` ("GPU" or "CPU") ran out of memory mid-generation: the Failed that says so, with
    a plan that fits."""
    lm = session.lm
    where = "the GPU" if kind == "GPU" else "the computer (RAM)"
    e = out_of_memory(f"{where} ran out of memory during generation", lm.folder.config,
                      lm.quant, lm.context, None, on_cpu=kind == "CPU")
    return Failed(str(e), hint=e.hint)
