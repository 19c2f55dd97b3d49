"""Print the bench JSON lines of one device run as a markdown table (for BENCHMARKS.md)."""

import json
import sys

print("| run | TTFT ms | prefill tok/s | decode tok/s | roofline tok/s (%) | generate() tok/s "
      "(TTFT ms) | peak VRAM GiB | path |")
print("|---|---|---|---|---|---|---|---|")
for line in open(sys.argv[1]):
    r = json.loads(line)
    hf = (f"{r['hf_generate_decode_tokens_per_s']:.1f} ({r['hf_generate_ttft_ms']:.0f})"
          if r.get("hf_generate_decode_tokens_per_s") else "-")
    print(f"| {r['label']} | {r['ttft_ms']:.1f} | {r['prefill_tokens_per_s']:,.0f} | "
          f"{r['decode_tokens_per_s']:,.1f} | {r['roofline_tokens_per_s']:,.0f} "
          f"({100 * r['roofline_fraction']:.0f}%) | {hf} | "
          f"{r['peak_vram_bytes'] / 2**30:.2f} | {r['decode_path']} |")
