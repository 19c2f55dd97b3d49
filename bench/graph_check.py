"""On a GPU: the CUDA-graph decode step against the same step run eagerly, teacher-forced; and the
engine's own step against transformers' eager modules (the math reference).

Every decoder gets the same prompt and then the same 256 tokens at the same positions; per step we
compare logits (relative error ||g - e|| / ||e||) and argmax wherever the reference's top-2 margin
exceeds bf16 rounding. The pass criterion is graph vs eager of the same step; the comparison with
transformers' modules is reported (its bf16 kernels differ: fused QKV GEMM, masked decode
attention), and in fp32 it must agree to 1e-4. Also reports which SDPA kernel ran a prefill chunk.
Usage: python bench/graph_check.py SHAPE_DIR QUANT [--steps 256] [--json OUT]
"""

from __future__ import annotations

import argparse
import copy
import json
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from engine.cache.kv_cache import KVCache  # noqa: E402
from engine.events import LoadRequest  # noqa: E402
from engine.load import loader  # noqa: E402
from engine.step.decode import Decoder  # noqa: E402
from engine.tools.bench.decode import _folder_for_random  # noqa: E402

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


class Tally:
    """Per-step relative error and argmax agreement where the reference's margin is decisive."""

    def __init__(self):
        self.errors: list[float] = []
        self.agree = self.decisive = 0

    def add(self, got: torch.Tensor, ref: torch.Tensor) -> None:
        self.errors.append(((got - ref).norm() / ref.norm()).item())
        top2 = ref.topk(2).values
        if (top2[0] - top2[1]).item() > BF16_ROUNDING * top2[0].abs().item():
            self.decisive += 1
            self.agree += int(got.argmax().item() == ref.argmax().item())

    def ok(self, bound: float) -> bool:
        return max(self.errors) <= bound and self.agree == self.decisive

    def summary(self) -> dict:
        return dict(max_rel_error=max(self.errors), median_rel_error=statistics.median(self.errors),
                    argmax_agree=self.agree, argmax_decisive_steps=self.decisive)


def _prefill_static(lm, static, prompt):
    """Fill the static step's cache with the prompt through transformers' modules (as prefill)."""
    d = Decoder(lm.model, static.cache, lm.device)
    d.forward(prompt, 0)


@torch.inference_mode()
def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("shape")
    ap.add_argument("quant", help="bf16, fp32 or nf4")
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
    static = copy.copy(graph.family)  # the same step and weights, run eagerly on its own cache
    static.cache = new_cache(lm, context)
    graph.forward(ids[: a.prompt], 0)
    eager.forward(ids[: a.prompt], 0)
    _prefill_static(lm, static, ids[: a.prompt])
    vs_static, vs_hf = Tally(), Tally()
    for step in range(a.steps):
        pos = a.prompt + step
        tok = ids[pos: pos + 1]
        lg = graph.step(tok, pos).float().clone()
        kv_len = next(b for b in graph.buckets if b > pos)
        static.cache.reserve(pos + 1)  # its own cache's blocks: the Decoder does this for graph
        ls = static(tok, torch.tensor([pos], device=lm.device), kv_len).float()
        le = eager.step(tok, pos).float()
        vs_static.add(lg, ls)
        vs_hf.add(lg, le)
    bound = BF16_ROUNDING if lm.compute_dtype != torch.float32 else 1e-4
    result = dict(shape=a.shape, quant=a.quant, steps=a.steps, graph_vs_eager=vs_static.summary(),
                  own_step_vs_transformers=vs_hf.summary(), prefill_kernels=kernels,
                  graph_notes=graph.notes, bound=bound,
                  passed=vs_static.ok(bound) and (lm.compute_dtype != torch.float32
                                                  or vs_hf.ok(bound)))
    print(json.dumps(result))
    if a.json:
        Path(a.json).write_text(json.dumps(result, indent=1))
    return 0 if result["passed"] else 1


if __name__ == "__main__":
    sys.exit(main())
