"""`hearth eval`: perplexity over a text file, through the engine's loader, attention and cache.

Strided sliding windows of the loaded context: each token is predicted exactly once, with at
least `window - stride` tokens of context once past the first window (the usual strided
perplexity). The weight format (`--quant`) and KV dtype (`--kv-dtype`) are the engine's own, so
the figure says what they cost in quality. Not a speed benchmark.
"""

from __future__ import annotations

import json
import math
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from engine.events import BadRequest, LoadRequest
from engine.files.model_folder import check

EXIT_OK, EXIT_BAD_INPUT = 0, 2
LOSS_CHUNK = 1024  # rows of logits upcast to fp32 at once: bounds memory for 150K vocabularies


@dataclass(frozen=True)
class EvalResult:
    perplexity: float
    nll_per_token: float
    tokens: int  # tokens predicted: all but the first of the text
    window: int
    stride: int


def windows(num_tokens: int, window: int, stride: int) -> list[tuple[int, int, int]]:
    """(begin, end, first_scored) per window: it reads tokens begin..end-1 and scores the
    predictions of tokens first_scored..end-1. Token 0 has no context and is never scored."""
    if not 0 < stride < window:  # windows must overlap: a window's first token has no context
        raise ValueError(f"need 0 < stride < window, got stride {stride}, window {window}")
    spans, scored_up_to = [], 1
    for begin in range(0, num_tokens, stride):
        end = min(begin + window, num_tokens)
        if end > scored_up_to:
            spans.append((begin, end, scored_up_to))
        scored_up_to = end
        if end == num_tokens:
            break
    return spans


def read_text(text_file: str) -> str:
    path = Path(text_file)
    if not path.is_file():
        raise BadRequest(f"text file {text_file} does not exist" if not path.exists()
                         else f"{text_file} is not a file")
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise BadRequest(f"{text_file} is not UTF-8 text") from None
    except OSError as e:
        raise BadRequest(f"cannot read {text_file}: {e.strerror}") from None
    if not text.strip():
        raise BadRequest(f"{text_file} is empty")
    return text


def perplexity(session, ids: list[int], stride: int | None = None, cache=None,
               predictions: list | None = None) -> EvalResult:
    """Score `ids` with the session's model; the window is the session's loaded context.
    `cache`: the KV cache the windows run on (default: the session's); `predictions`, a list
    that receives each window's most likely next tokens (a [scored] tensor per window)."""
    import torch

    from engine.attention.prefill import StepContext

    if len(ids) < 2:
        raise BadRequest(f"the text has {len(ids)} token(s); perplexity needs at least 2")
    lm, window = session.lm, session.lm.context
    cache = session.cache if cache is None else cache
    stride = stride or max(1, window // 2)
    tokens = torch.tensor(ids, dtype=torch.long, device=lm.device)
    nll, count = 0.0, 0
    with torch.inference_mode():
        for begin, end, first in windows(len(ids), window, stride):
            T = end - begin
            positions = torch.arange(T, device=lm.device)
            keep = end - first + 1  # logits of positions first-1..end-1; the last predicts nothing
            # every window starts a fresh context at position 0, written over the engine's cache
            out = lm.model(input_ids=tokens[None, begin:end], position_ids=positions[None],
                           use_cache=False, logits_to_keep=keep,
                           hearth_step=StepContext(cache, positions, 0, T))
            logits = out.logits[0, :-1]  # [end - first, V]
            targets = tokens[first:end]
            for lo in range(0, targets.numel(), LOSS_CHUNK):
                nll += float(torch.nn.functional.cross_entropy(
                    logits[lo:lo + LOSS_CHUNK].float(), targets[lo:lo + LOSS_CHUNK],
                    reduction="sum"))
            if predictions is not None:
                predictions.append(logits.argmax(-1).cpu())
            count += targets.numel()
    mean = nll / count
    return EvalResult(math.exp(mean), mean, count, window, stride)


def against_reference(session, ids: list[int], result: EvalResult, got: list) -> dict:
    """For a quantized KV cache: the same windows again on a cache in the model's own dtype
    (bf16 for bf16 weights, fp32 for fp32), in this run -> its perplexity, the quantized
    cache's relative perplexity change, and top-1 agreement: the share of scored positions
    whose most likely next token is the same under both caches (`got`: the quantized run's
    predictions, from perplexity). {} for an unquantized cache."""
    from engine.cache.kv_cache import KVCache
    from engine.formats import kv_dtypes
    from engine.generate.session_load import NATIVE_KV

    if not kv_dtypes.get(session.kv_dtype).scaled:
        return {}
    lm, c = session.lm, session.cache
    reference_kv = NATIVE_KV[lm.compute_dtype]
    ref_cache = KVCache(len(c.k), c.num_kv_heads, c.head_dim, min(lm.context, len(ids)),
                        reference_kv, lm.device, backends=c.backends)
    want = []
    ref = perplexity(session, ids, result.stride, cache=ref_cache, predictions=want)
    same = sum(int((a == b).sum()) for a, b in zip(got, want, strict=True))
    return {"reference_kv_dtype": reference_kv, "reference_perplexity": ref.perplexity,
            "perplexity_change": result.perplexity / ref.perplexity - 1,
            "top1_agreement": same / result.tokens}


def run_eval(model: str | None, text_file: str, quant: str = "auto", kv_dtype: str = "auto",
             as_json: bool = False, lm_head: str = "16bit") -> int:
    """Print the perplexity of `model` (None: the demo model) over `text_file`; 0, or 2 for bad
    input with one line on stderr. With as_json, stdout holds exactly one JSON object."""
    try:
        text = read_text(text_file)
        req = LoadRequest(model, quant, kv_dtype, lm_head=lm_head)
        req.validate()
        check(model)  # before torch: a bad folder fails in well under a second
        from transformers.utils import logging as hf_logging

        from engine.generate.session import Session

        hf_logging.disable_progress_bar()  # stdout and stderr carry the result or one line
        t0 = time.perf_counter()
        session = Session.load(req)
        ids = list(session.lm.tokenizer(text, verbose=False)["input_ids"])
        got = []
        result = perplexity(session, ids, predictions=got)
        versus = against_reference(session, ids, result, got)
    except BadRequest as e:
        print(f"hearth eval: {' '.join(str(e).split())}", file=sys.stderr)
        return EXIT_BAD_INPUT
    report = {**asdict(result), "model": str(session.lm.folder.path), "text": text_file,
              "quant": session.lm.quant, "lm_head": lm_head, "kv_dtype": session.kv_dtype,
              "device": str(session.lm.device), **versus,
              "seconds": round(time.perf_counter() - t0, 2)}
    if as_json:
        print(json.dumps(report))
    else:
        print(f"perplexity {result.perplexity:.4f} over {result.tokens} tokens of {text_file} "
              f"(window {result.window}, stride {result.stride}; {report['quant']} weights"
              f"{'' if lm_head == '16bit' else f', {lm_head} lm_head'}, "
              f"{report['kv_dtype']} KV cache on {report['device']}; {report['seconds']} s)")
        if versus:
            print(f"against the {versus['reference_kv_dtype']} KV cache over the same windows: "
                  f"top-1 agreement {100 * versus['top1_agreement']:.2f}%, perplexity "
                  f"{100 * versus['perplexity_change']:+.3f}% (from "
                  f"{versus['reference_perplexity']:.4f})")
    return EXIT_OK
