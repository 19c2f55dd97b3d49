"""What a quantized KV cache (int8, fp8) costs in quality, against the model's own 16-bit cache.

On the bundled demo model (or --model) over the held-out text that `hearth eval` scores, cut into
windows of the model's context (1,024 tokens for the demo). Every figure goes through the engine's
decode step, the path generation takes (CPU: the eager fused step; GPU: the CUDA graphs and, for
int8/fp8, the Triton decode-attention kernel):
- teacher-forced: each window's tokens fed one step at a time; per position, whether the top-1
  next token equals the reference cache's, and KL(reference || quantized) of the next-token
  distributions; the perplexity of the text under each cache beside them;
- free-running: the first 3/4 of a window as the prompt, then --new-tokens greedy tokens; how
  many come out identical to the reference's before the first difference.
Prints a markdown table. Usage, from the repository root:
    python3 bench/kv_quality.py [--model PATH] [--quant fp32] [--device cpu|cuda]
        [--windows N] [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from engine.events import GenerateRequest, LoadRequest, SamplingParams, Token  # noqa: E402
from engine.generate.session import Session  # noqa: E402

HELDOUT = Path(__file__).resolve().parents[1] / "packaging" / "demo_model" / "heldout.txt"


def teacher_forced(session: Session, window: list[int]) -> torch.Tensor:
    """The window fed one token a step -> fp32 logits of every position [T, V]."""
    session.cache.crop(0)
    d = session.decoder
    ids = torch.tensor(window, device=session.lm.device)
    rows = [d.forward(ids[:1], 0).float()]
    for p in range(1, len(window)):
        rows.append(d.step(ids[p:p + 1], p).float())  # a graph's buffer: copied by .float()
    session.cache.crop(0)
    return torch.stack(rows)


def greedy(session: Session, prompt: list[int], new_tokens: int) -> list[int]:
    session.cache.clear()  # from scratch: no prefix cached by an earlier prompt
    req = GenerateRequest(prompt_ids=tuple(prompt), max_new_tokens=new_tokens, ignore_eos=True,
                          sampling=SamplingParams(temperature=0.0), num_speculative_tokens=0)
    return [i for e in session.generate(req) if isinstance(e, Token) for i in e.token_ids]


def same_prefix(a: list[int], b: list[int]) -> int:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


def measure(args) -> dict:
    sessions = {}
    for kv in ("auto", *args.kv_dtypes):
        sessions[kv] = Session.load(LoadRequest(args.model, args.quant, kv, device=args.device))
    ref = sessions.pop("auto")
    lm = ref.lm
    context = lm.context
    text = HELDOUT.read_text(encoding="utf-8") if args.text is None else Path(
        args.text).read_text(encoding="utf-8")
    ids = list(lm.tokenizer(text, verbose=False)["input_ids"])
    windows = [ids[i:i + context] for i in range(0, len(ids) - context + 1, context)]
    windows = windows[:args.windows] if args.windows else windows
    prompt_len = context - args.new_tokens
    rows = {kv: dict(agree=0, kl=0.0, nll=0.0, prefix=0, identical=0) for kv in sessions}
    ref_nll, positions = 0.0, 0
    t0 = time.perf_counter()
    for w in windows:
        target = torch.tensor(w[1:], device=lm.device)
        base = teacher_forced(ref, w)[:-1]  # [T - 1, V]: predictions of tokens 1..T-1
        logp_ref = base.log_softmax(-1)
        ref_nll += float(-logp_ref.gather(1, target[:, None]).sum())
        positions += target.numel()
        ref_tokens = greedy(ref, w[:prompt_len], args.new_tokens)
        for kv, s in sessions.items():
            logp = teacher_forced(s, w)[:-1].log_softmax(-1)
            r = rows[kv]
            r["agree"] += int((logp.argmax(-1) == base.argmax(-1)).sum())
            r["kl"] += float((logp_ref.exp() * (logp_ref - logp)).sum())
            r["nll"] += float(-logp.gather(1, target[:, None]).sum())
            n = same_prefix(greedy(s, w[:prompt_len], args.new_tokens), ref_tokens)
            r["prefix"] += n
            r["identical"] += n == args.new_tokens
    result = dict(model=str(lm.folder.path), device=_device_name(lm.device),
                  weights=lm.quant, reference_kv=ref.kv_dtype, windows=len(windows),
                  window_tokens=context, positions=positions, new_tokens=args.new_tokens,
                  prompt_tokens=prompt_len, reference_perplexity=_ppl(ref_nll, positions),
                  seconds=round(time.perf_counter() - t0, 1), rows={})
    for kv, r in rows.items():
        s = sessions[kv]
        result["rows"][kv] = dict(
            top1_agreement=r["agree"] / positions, kl_nats=r["kl"] / positions,
            perplexity=_ppl(r["nll"], positions),
            greedy_same_prefix=r["prefix"] / len(windows),
            greedy_identical_runs=r["identical"],
            kv_bytes=s.cache.num_bytes,
            kv_bytes_vs_reference=s.cache.num_bytes / ref.cache.num_bytes,
            decode_path=s.decoder.mode)
    return result


def _ppl(nll: float, n: int) -> float:
    import math

    return math.exp(nll / n)


def _device_name(dev: torch.device) -> str:
    return torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu"


def markdown(r: dict) -> str:
    n, new = r["windows"], r["new_tokens"]
    lines = [
        f"{r['model']}, {r['weights']} weights, on {r['device']}; reference: the "
        f"{r['reference_kv']} KV cache (perplexity {r['reference_perplexity']:.4f}); {n} "
        f"windows of {r['window_tokens']} held-out tokens ({r['positions']:,} teacher-forced "
        f"positions); greedy: {r['prompt_tokens']}-token prompts, {new} new tokens; "
        f"{r['seconds']} s", "",
        "| KV cache | top-1 agreement | KL (nats/token) | perplexity | greedy: same tokens before "
        f"the first difference (of {new}) | greedy: identical runs | KV bytes vs "
        f"{r['reference_kv']} | decode path |",
        "|---|---|---|---|---|---|---|---|"]
    for kv, x in r["rows"].items():
        lines.append(
            f"| {kv} | {100 * x['top1_agreement']:.2f}% | {x['kl_nats']:.2e} | "
            f"{x['perplexity']:.4f} | {x['greedy_same_prefix']:.1f} | "
            f"{x['greedy_identical_runs']}/{n} | {100 * x['kv_bytes_vs_reference']:.1f}% | "
            f"{x['decode_path']} |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", help="model folder (default: the bundled demo model)")
    p.add_argument("--text", help=f"text to score (default: {HELDOUT.name} of the demo corpus)")
    p.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"])
    p.add_argument("--quant", default="auto", help="weight format (auto: bf16 as bundled)")
    p.add_argument("--threads", type=int, default=1, help="CPU threads (tiny model: 1 is enough)")
    p.add_argument("--kv-dtypes", nargs="+", default=["int8", "fp8", "fp32"],
                   help="caches to compare with the model's own (fp32: a yardstick of rounding)")
    p.add_argument("--windows", type=int, help="use only the first N windows")
    p.add_argument("--new-tokens", type=int, default=256)
    p.add_argument("--json", metavar="FILE", help="also write the figures as JSON")
    args = p.parse_args(argv)
    torch.manual_seed(0)
    torch.set_num_threads(args.threads)
    result = measure(args)
    print(markdown(result), flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
