#!/usr/bin/env bash
# One GPU: what the reproducible mode costs: `hearth bench` for the 7B shape, bf16 and AWQ,
# with --reproducible off and on in turn (random weights, 512-token prompt, 256 new tokens,
# median of 3). Usage (repo root, carry [".whl"]): bash bench/reproducible.sh
set -u
source bench/device_env.sh
B=bench
for quant in bf16 awq; do
    for mode in off on; do
        echo "== 7b-$quant reproducible $mode" | tee -a "$LOG"
        if timeout 200 python3 -m engine.cli.cli bench --model $B/qwen2.5-7b --random-weights \
            --quant $quant --reproducible $mode --out /tmp/r.json >>"$LOG" 2>&1; then
            python3 -c "import json,sys; r=json.load(open('/tmp/r.json')); r['label']=sys.argv[1]; print(json.dumps(r))" "7b-$quant-$mode" >>"$OUT/bench.jsonl"
        else echo "FAILED 7b-$quant $mode" | tee -a "$LOG"; tail -5 "$LOG"; fi
    done
done
python3 - "$OUT/bench.jsonl" <<'PY' | tee "$OUT/table.md"
import json, sys
print("| row | decode tok/s | roofline tok/s | prefill tok/s | TTFT ms | notes |")
print("|---|---|---|---|---|---|")
for line in open(sys.argv[1]):
    r = json.loads(line)
    notes = [n for n in r.get("notes", []) if "reproducible" in n]
    print(f"| {r['label']} | {r.get('decode_tokens_per_s')} | {r.get('roofline_tokens_per_s')} | "
          f"{r.get('prefill_tokens_per_s')} | {r.get('ttft_ms')} | {'; '.join(notes)} |")
PY
