"""What an int8/fp8 KV cache costs on a real model, the way `hearth eval --kv-dtype` measures it:
perplexity and top-1 agreement with the model's own 16-bit/fp32 cache over the same windows, in
one run. The README's KV figures come from this table.

Rows per KV dtype: a 16-bit one (fp16, bf16) as it is, the noise floor of the comparison; a
quantized one (int8, fp8: a scale per 32 elements of a head, kernels/kv_quant.py) twice, with
keys and queries rotated (cache/key_rotation.py) and with keys stored as they come, the
engine's default marked.

Default text: the first 81 lines of Debian 12's glibc changelog (entries from March 2025 to April
2026, written after SmolLM2 was trained), as bench/smollm2_table.py scores. Usage, from
the repository root:
    python bench/kv_eval_table.py MODEL_FOLDER [--quant fp32] [--text FILE] [--json F]
        [--kv-dtypes fp16 int8 fp8]
"""

from __future__ import annotations

import argparse
import gzip
import json
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from engine.cache import key_rotation  # noqa: E402
from engine.cache.kv_cache import KVCache  # noqa: E402
from engine.events import LoadRequest  # noqa: E402
from engine.formats import kv_dtypes  # noqa: E402
from engine.generate.session import Session  # noqa: E402
from engine.tools.eval import perplexity  # noqa: E402

CHANGELOG = Path("/usr/share/doc/libc6/changelog.Debian.gz")
LINES = 81


def default_text() -> str:
    lines = gzip.open(CHANGELOG, "rt", encoding="utf-8").read().splitlines()[:LINES]
    return "\n".join(lines) + "\n"


def cache_like(session, kv_dtype: str, length: int) -> KVCache:
    c = session.cache
    return KVCache(len(c.k), c.num_kv_heads, c.head_dim, length, kv_dtype, session.lm.device,
                   backends=c.backends)


def measure(args) -> dict:
    session = Session.load(LoadRequest(args.model, args.quant, "auto", device="cpu"))
    text = default_text() if args.text is None else Path(args.text).read_text(encoding="utf-8")
    ids = list(session.lm.tokenizer(text, verbose=False)["input_ids"])
    length = min(session.lm.context, len(ids))
    t0 = time.perf_counter()
    want: list = []
    ref = perplexity(session, ids, cache=cache_like(session, session.kv_dtype, length),
                     predictions=want)

    def row(cache: KVCache) -> dict:
        got: list = []
        r = perplexity(session, ids, cache=cache, predictions=got)
        same = sum(int((a == b).sum()) for a, b in zip(got, want, strict=True))
        x = dict(perplexity=r.perplexity, perplexity_change=r.perplexity / ref.perplexity - 1,
                 top1_agreement=same / r.tokens, positions_that_differ=r.tokens - same)
        print(f"{cache.kv_dtype}: {x}", file=sys.stderr, flush=True)  # progress
        return x

    rows = {}
    for kv in args.kv_dtypes:
        if not kv_dtypes.get(kv).scaled:
            rows[kv] = row(cache_like(session, kv, length))
            continue
        default = kv_dtypes.get(kv).rotated_keys
        for rotate in (default, not default):  # the engine's default first
            name = "rotated keys" if rotate else "keys as they come"
            cache = cache_like(session, kv, length)
            cache.key_rotation = key_rotation.matrix(cache.head_dim, cache.device) if rotate \
                else None
            rows[f"{kv}, {name}{' (default)' if rotate == default else ''}"] = row(cache)
    return dict(model=str(session.lm.folder.path), weights=session.lm.quant,
                reference_kv=session.kv_dtype, reference_perplexity=ref.perplexity,
                tokens=ref.tokens, window=ref.window, text=args.text or f"{CHANGELOG} lines 1-81",
                seconds=round(time.perf_counter() - t0, 1), rows=rows)


def markdown(r: dict) -> str:
    """The table as BENCHMARKS.md and the README hold it, with the line that says where from."""
    ref = r["reference_kv"]
    lines = [f"{r['model']}, {r['weights']} weights, CPU; {r['tokens']:,} scored tokens of "
             f"{r['text']}; reference: the {ref} KV cache, perplexity "
             f"{r['reference_perplexity']:.4f}; {r['seconds']} s", "",
             f"| KV cache | top-1 agreement with {ref} (positions that differ of "
             f"{r['tokens']:,}) | perplexity | vs {ref} |", "|---|---|---|---|"]
    for name, x in r["rows"].items():
        if name in kv_dtypes.names():  # a 16-bit cache's row, named by its dtype alone
            name += " (the comparison's noise floor)"
        lines.append(f"| {name.replace('(default)', '(the default)')} "
                     f"| {100 * x['top1_agreement']:.2f}% ({x['positions_that_differ']}) "
                     f"| {x['perplexity']:.4f} | {100 * x['perplexity_change']:+.3f}% |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("model", help="model folder (e.g. SmolLM2-135M-Instruct from hearth import)")
    p.add_argument("--quant", default="fp32", help="weight format (default fp32)")
    p.add_argument("--text", help=f"text to score (default: {CHANGELOG}, lines 1-{LINES})")
    p.add_argument("--kv-dtypes", nargs="+", default=["fp16", "int8", "fp8"])
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--json", metavar="FILE", help="also write the figures as JSON")
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    result = measure(args)
    print(markdown(result), flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
