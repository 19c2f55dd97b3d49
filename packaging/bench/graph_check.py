"""On a GPU: the CUDA-graph decode step against transformers' eager modules, teacher-forced.

Both decoders get the same prompt and then the same 256 tokens at the same positions; per step we
compare logits (relative error ||g - e|| / ||e||) and argmax wherever the eager top-2 margin exceeds
bf16 rounding. Also reports which SDPA kernel ran a prefill chunk (flash expected in bf16).
Usage: python packaging/bench/graph_check.py SHAPE_DIR QUANT [--steps 256] [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from engine import loader  # noqa: E402
from engine.bench import _folder_for_random  # noqa: E402
from engine.decode import Decoder  # noqa: E402
from engine.events import LoadRequest  # noqa: E402
from engine.kv_cache import KVCache  # noqa: E402

BF16_ROUNDING = 1e-2  # relative error bound for bf16 activations (METHOD.md)


def new_cache(lm, context):
    cfg = lm.model.config
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    return KVCache(cfg.num_hidden_layers, cfg.num_key_value_heads, head_dim, context,
                   lm.compute_dtype, lm.device)


def prefill_kernels(decoder: Decoder, ids: torch.Tensor) -> list[str]:
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        decoder.forward(ids, 0)
        torch.cuda.synchronize()
    names = {e.key for e in prof.key_averages()}
    return sorted(n for n in names if "flash" in n.lower() or "fmha" in n.lower()
                  or "attention" in n.lower())[:6]


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("shape")
    ap.add_argument("quant")
    ap.add_argument("--steps", type=int, default=256)
    ap.add_argument("--prompt", type=int, default=64)
    ap.add_argument("--json")
    a = ap.parse_args()
    context = a.prompt + a.steps + 1
    req = LoadRequest(model=a.shape, quant=a.quant, device="cuda", context=context)
    lm = loader.random_model(_folder_for_random(a.shape), req)
    graph = Decoder(lm.model, new_cache(lm, context), lm.device)
    graph.setup_fast_path(allow_graph=True, compile_layers=False)
    eager = Decoder(lm.model, new_cache(lm, context), lm.device)  # transformers' modules
    assert graph.mode == "graph", graph.notes
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(3, lm.model.config.vocab_size - 1, (a.prompt + a.steps,), generator=g)
    ids = ids.to(lm.device)
    kernels = prefill_kernels(eager, ids[: a.prompt])
    graph.forward(ids[: a.prompt], 0)
    eager.forward(ids[: a.prompt], 0)
    worst, agree, decisive = 0.0, 0, 0
    for step in range(a.steps):
        pos = a.prompt + step
        tok = ids[pos: pos + 1]
        lg = graph.step(tok, pos).float().clone()
        le = eager.step(tok, pos).float()
        rel = ((lg - le).norm() / le.norm()).item()
        worst = max(worst, rel)
        top2 = le.topk(2).values
        if (top2[0] - top2[1]).item() > BF16_ROUNDING * top2[0].abs().item():
            decisive += 1
            agree += int(lg.argmax().item() == le.argmax().item())
    result = dict(shape=a.shape, quant=a.quant, steps=a.steps, max_rel_error=worst,
                  argmax_agree=agree, argmax_decisive_steps=decisive, prefill_kernels=kernels,
                  graph_notes=graph.notes, passed=worst <= BF16_ROUNDING and agree == decisive)
    print(json.dumps(result))
    if a.json:
        Path(a.json).write_text(json.dumps(result, indent=1))
    return 0 if result["passed"] else 1


if __name__ == "__main__":
    sys.exit(main())
