"""On a GPU: `hearth bench`'s measurement (engine/tools/bench/decode.py: greedy, batch 1, median
decode of 3 runs, the roofline of the same run) for several KV caches and prompt lengths over ONE
random-weight model: an 8B NF4 model built on the CPU (engine/load/loader.py) takes minutes, which a
benchmark of 7 settings in one device call cannot pay 7 times. By default the model is built on
the GPU in bf16 and quantized in place (the card has room), as `hearth bench` did before.

Each setting is a fresh Session (its own cache, CUDA graphs per KV bucket) over the same weights;
"bf16-sdpa" is a bf16 cache read by SDPA (the default for 16-bit caches); the others go through
the Triton kernel (HEARTH_DECODE_ATTENTION=triton).
Usage (repository root):
    python3 bench/kv_e2e.py --model bench/llama-3.1-8b --quant nf4 \
        --kv bf16 bf16-sdpa int8 fp8 --prompt-lens 1024 32768 [--new-tokens 128] [--runs 3]
        [--json FILE]     (--quant awq: random int4 codes made on the GPU, as `hearth bench`)
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from engine.attention import prefill as attention  # noqa: E402
from engine.events import LoadRequest  # noqa: E402
from engine.generate.session import Session  # noqa: E402
from engine.kernels import attention_backend
from engine.load import loader
from engine.tools.bench.decode import NUM_RUNS, _folder_for_random, _prompts, _run_one  # noqa: E402
from engine.tools.bench.references import copy_bandwidth, decode_bytes  # noqa: E402


def build_on_gpu(folder, req: LoadRequest) -> loader.LoadedModel:
    """loader.random_model, but built on the GPU in 16 bits and quantized in place."""
    from transformers import AutoConfig, AutoModelForCausalLM

    from engine.quant.bnb import quantize_linears

    device, quant, dtype = loader._placement(req, folder)
    config = AutoConfig.from_pretrained(folder.path, trust_remote_code=False)
    torch.manual_seed(0)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(config, dtype=dtype,
                                                 attn_implementation="sdpa").eval()
    if quant in ("nf4", "int8"):
        quantize_linears(model, quant, dtype)  # each layer quantized where it is: the GPU
    attention.register()
    model.set_attn_implementation(attention.ATTN_IMPLEMENTATION)
    context, notes = loader._context(folder.config, req.context)
    return loader.LoadedModel(folder, model, None, {}, frozenset(), device, quant, dtype,
                              context, (*notes, "random weights"))


def measure(session: Session, prompt_len: int, new_tokens: int, bandwidth: float,
            runs: int = NUM_RUNS) -> dict:
    vocab = session.lm.model.config.vocab_size
    prompts = _prompts(runs, prompt_len, vocab, seed=0)
    _run_one(session, prompts[0][:16], 4)  # warm-up
    stats = [_run_one(session, ids, new_tokens)[0].stats for ids in prompts]
    decode = statistics.median(s.decode_tokens_per_s for s in stats)
    per_token = session.cache.bytes_per_token
    step_bytes = decode_bytes(session.lm.model, per_token, prompt_len + new_tokens)
    roofline = bandwidth / step_bytes
    note = next((n for n in session.loaded_event().notes if n.startswith("decode attention")), "")
    return dict(kv_dtype=session.kv_dtype, prompt_len=prompt_len, new_tokens=new_tokens,
                decode_path=session.decoder.mode,
                ttft_ms=statistics.median(s.ttft_ms for s in stats),
                decode_tokens_per_s=decode,
                decode_runs_tokens_per_s=[s.decode_tokens_per_s for s in stats],
                kv_bytes_per_token=per_token, bytes_per_decode_step=step_bytes,
                roofline_tokens_per_s=round(roofline, 1),
                roofline_fraction=round(decode / roofline, 3), decode_attention=note)


def _device_name(dev: torch.device) -> str:
    return torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", required=True, help="a folder with config.json (random weights)")
    p.add_argument("--quant", default="nf4")
    p.add_argument("--kv", nargs="+", default=["bf16", "bf16-sdpa", "int8", "fp8"])
    p.add_argument("--prompt-lens", type=int, nargs="+", default=[1024, 32768])
    p.add_argument("--new-tokens", type=int, default=128)
    p.add_argument("--runs", type=int, default=NUM_RUNS, help="timed runs per setting (median)")
    p.add_argument("--build-on-cpu", action="store_true",
                   help="build as `hearth bench` does now (CPU, quantized on the way)")
    p.add_argument("--json", metavar="FILE")
    args = p.parse_args(argv)
    folder = _folder_for_random(args.model)
    req = LoadRequest(model=args.model, quant=args.quant, device="auto",
                      context=max(args.prompt_lens) + args.new_tokens)
    t0 = time.perf_counter()
    # AWQ is built as `hearth bench` builds it: random 4-bit codes made on the device
    build = loader.random_model if args.build_on_cpu or args.quant == "awq" else build_on_gpu
    lm = build(folder, req)
    print(f"model built in {time.perf_counter() - t0:.1f} s ({lm.quant}, context {lm.context})",
          flush=True)
    bandwidth = copy_bandwidth(lm.device)
    rows = []
    for prompt_len in args.prompt_lens:
        for kv in args.kv:
            os.environ[attention_backend.ENV] = "sdpa" if kv.endswith("-sdpa") else "triton"
            t = time.perf_counter()
            try:
                session = Session(lm, kv.removesuffix("-sdpa"))
                row = {"label": kv, **measure(session, prompt_len, args.new_tokens, bandwidth,
                                                     args.runs)}
            except Exception as e:  # report and go on to the next setting
                row = {"label": kv, "prompt_len": prompt_len, "error": f"{type(e).__name__}: {e}"}
            row["seconds"] = round(time.perf_counter() - t, 1)
            print(json.dumps(row), flush=True)
            rows.append(row)
            session = None
            gc.collect()
            if lm.device.type == "cuda":
                torch.cuda.empty_cache()
    print(f"\n{args.model}, {lm.quant} weights (random), {_device_name(lm.device)}, copy "
          f"bandwidth {bandwidth / 1e12:.2f} TB/s; greedy, batch 1, {args.new_tokens} new tokens,"
          f" decode the median of {args.runs} runs\n")
    print("| KV cache | prompt | TTFT ms | decode tok/s (runs) | roofline tok/s | achieved | "
          "KV bytes/token | decode attention |")
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        if "error" in r:
            print(f"| {r['label']} | {r['prompt_len']} | failed: {r['error']} |||||")
            continue
        runs = ", ".join(f"{x:.1f}" for x in r["decode_runs_tokens_per_s"])
        print(f"| {r['label']} | {r['prompt_len']:,} | {r['ttft_ms']:.1f} | "
              f"{r['decode_tokens_per_s']:.1f} ({runs}) | {r['roofline_tokens_per_s']:.1f} | "
              f"{100 * r['roofline_fraction']:.0f}% | {r['kv_bytes_per_token']:,} | "
              f"{r['decode_attention'].split(': ', 1)[-1]} |")
    if args.json:
        with open(args.json, "w") as f:
            for r in rows:
                f.write(json.dumps(r) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
