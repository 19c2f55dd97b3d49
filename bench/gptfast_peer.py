"""The peer of the decode targets: gpt-fast (pytorch-labs/gpt-fast), run from its own
model.py and quantize.py with random weights, as its generate.py runs decode (the model's forward
compiled with mode="reduce-overhead", fullgraph, one token a step, greedy). Its files are not in
the project: copy them into a folder outside the package (`.peers/gpt-fast`, git-ignored) and
carry it to the device. Two adaptations, both outside its code: quantize.py's tokenizer import
is stubbed (sentencepiece and tiktoken are not on the device, and nothing here tokenizes), and
where this torch's `_convert_weight_to_int4pack` takes uint8 pairs instead of gpt-fast's int32
codes, the codes are paired first (what torchao does). One JSON line on stdout.
Usage: python3 bench/gptfast_peer.py --gpt-fast .peers/gpt-fast --model llama-3.1-8b
       [--int4] [--prompt-len 512] [--new-tokens 256]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import types

import torch


def load_gpt_fast(folder: str):
    sys.path.insert(0, folder)
    sys.modules.setdefault("tokenizer", types.SimpleNamespace(get_tokenizer=None))
    import model as gf_model
    import quantize as gf_quant

    original = gf_quant.prepare_int4_weight_and_scales_and_zeros

    def prepare(weight_bf16, groupsize, inner_k_tiles):
        try:
            return original(weight_bf16, groupsize, inner_k_tiles)
        except RuntimeError:  # this torch packs uint8 pairs, even k in the high nibble
            w, sz = gf_quant.group_quantize_tensor(weight_bf16, n_bit=4, groupsize=groupsize)
            pairs = ((w[:, ::2] << 4) | w[:, 1::2]).to(torch.uint8)
            return torch.ops.aten._convert_weight_to_int4pack(pairs, inner_k_tiles), sz

    gf_quant.prepare_int4_weight_and_scales_and_zeros = prepare
    return gf_model, gf_quant


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--gpt-fast", required=True, help="folder holding gpt-fast's model.py etc.")
    p.add_argument("--model", default="llama-3.1-8b", help="a gpt-fast transformer_configs name")
    p.add_argument("--int4", action="store_true", help="its int4 (groupsize 128, every linear)")
    p.add_argument("--prompt-len", type=int, default=512)
    p.add_argument("--new-tokens", type=int, default=256)
    args = p.parse_args()
    gf_model, gf_quant = load_gpt_fast(args.gpt_fast)
    torch.manual_seed(0)
    dev = torch.device("cuda")
    with torch.device(dev):
        model = gf_model.Transformer.from_name(args.model).to(torch.bfloat16)
    for name, w in model.named_parameters():  # random weights of a trained model's scale
        w.data.fill_(1.0) if "norm" in name else w.data.normal_(0, 0.02)
    if args.int4:
        handler = gf_quant.WeightOnlyInt4QuantHandler(model, groupsize=128)
        state = handler.create_quantized_state_dict()
        model = handler.convert_for_runtime()
        model.load_state_dict(state, assign=True)
        model = model.to(dev)
    weight_bytes = sum(t.numel() * t.element_size() for t in model.state_dict().values())
    with torch.device(dev):
        model.setup_caches(max_batch_size=1, max_seq_length=args.prompt_len + args.new_tokens + 8)
    forward = torch.compile(model.forward, mode="reduce-overhead", fullgraph=True)
    prompt = torch.randint(0, model.config.vocab_size, (1, args.prompt_len), device=dev)

    @torch.inference_mode()
    def generate() -> tuple[float, float]:
        pos = torch.arange(args.prompt_len, device=dev)
        t0 = time.perf_counter()
        token = model(prompt, pos)[:, -1].argmax(-1, keepdim=True)  # prefill: eager
        torch.cuda.synchronize()
        t1 = time.perf_counter()
        for i in range(args.new_tokens - 1):
            pos = torch.tensor([args.prompt_len + i], device=dev)
            token = forward(token, pos)[:, -1].argmax(-1, keepdim=True).clone()
        torch.cuda.synchronize()
        return t1 - t0, time.perf_counter() - t1

    t_compile = time.perf_counter()
    generate()  # compiles and captures
    t_compile = time.perf_counter() - t_compile
    runs = [generate() for _ in range(3)]
    decode_s = sorted(r[1] for r in runs)[1]
    print(json.dumps({"peer": "gpt-fast", "model": args.model,
                      "quant": "int4-g128" if args.int4 else "bf16",
                      "decode_tokens_per_s": round((args.new_tokens - 1) / decode_s, 1),
                      "ttft_ms": round(sorted(r[0] for r in runs)[1] * 1e3, 1),
                      "weight_gb": round(weight_bytes / 1e9, 2),
                      "weight_tb_per_s": round(weight_bytes * (args.new_tokens - 1) / decode_s
                                               / 1e12, 2),
                      "warmup_s": round(t_compile, 1), "prompt_len": args.prompt_len,
                      "new_tokens": args.new_tokens, "torch": torch.__version__}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
