"""Print the bench JSON lines of one device run as a markdown table (for BENCHMARKS.md):
`summarize.py FILE` for plain decode rows, `summarize.py --speculative FILE` for speculative
ones."""

import json
import sys

PLAIN = ("run", "TTFT ms", "prefill tok/s", "decode tok/s", "roofline tok/s (%)",
         "generate() tok/s (TTFT ms)", "peak VRAM GiB", "path")
SPECULATIVE = ("label", "plain tokens/s", "speculative tokens/s", "speedup", "alpha",
               "mean accepted length", "c", "expected", "same tokens", "with switch-off")


def plain_row(r: dict) -> list:
    hf = (f"{r['hf_generate_decode_tokens_per_s']:.1f} ({r['hf_generate_ttft_ms']:.0f})"
          if r.get("hf_generate_decode_tokens_per_s") else "-")
    return [r["label"], f"{r['ttft_ms']:.1f}", f"{r['prefill_tokens_per_s']:,.0f}",
            f"{r['decode_tokens_per_s']:,.1f}",
            f"{r['roofline_tokens_per_s']:,.0f} ({100 * r['roofline_fraction']:.0f}%)", hf,
            f"{r['peak_vram_bytes'] / 2**30:.2f}", r["decode_path"]]


def speculative_row(r: dict) -> list:
    s = r["speculative"]
    return [r["label"], r["decode_tokens_per_s"], s["decode_tokens_per_s"], s["speedup"],
            s["acceptance_rate"], s["mean_accepted_length"], s["draft_step_ratio"],
            s["expected_speedup"], s["identical_to_plain"], s["switch_off_speedup"]]


def table(header: tuple, row, path: str) -> None:
    print("| " + " | ".join(header) + " |")
    print("|" + "---|" * len(header))
    for line in open(path):
        print("| " + " | ".join(str(v) for v in row(json.loads(line))) + " |")


if __name__ == "__main__":
    if sys.argv[1] == "--speculative":
        table(SPECULATIVE, speculative_row, sys.argv[2])
    else:
        table(PLAIN, plain_row, sys.argv[1])
