#!/usr/bin/env bash
# Issue #23's must-hold, in one device call: the engine before the move into layers (7c5b653) and
# after, row by row, old then new: 7B bf16, 7B AWQ (compiled, tinygemm) and the 8B shape's bf16
# weights with an int8 KV cache at a 32K prompt. The old tree travels as old-7c5b653/ (carried), made
# here with: mkdir old-7c5b653 && git archive 7c5b653 engine pyproject.toml | tar -x -C old-7c5b653
# Its demo model is byte-identical to hearth_resources/ and is copied in on the device.
# Usage (repo root, carry [".whl", "old-7c5b653"]): bash packaging/bench/layers_compare.sh [rounds]
set -u
source packaging/bench/device_env.sh
B=$PWD/packaging/bench  # absolute: the old tree runs from its own folder
OLD=$PWD/old-7c5b653
mkdir -p "$OLD/resources" && cp -r hearth_resources/. "$OLD/resources/"
row() {  # tree (old|new), label, then hearth bench arguments
    local tree=$1 label=$2; shift 2
    echo "== $tree $label: hearth bench $*" | tee -a "$LOG"
    if [ "$tree" = old ]; then
        (cd "$OLD" && PYTHONPATH=/tmp/site:$OLD timeout 170 python3 -m engine.cli bench \
            --out /tmp/r.json "$@") >>"$LOG" 2>&1
    else
        timeout 170 python3 -m engine.serve.cli bench --out /tmp/r.json "$@" >>"$LOG" 2>&1
    fi && python3 -c "import json,sys; r=json.load(open('/tmp/r.json')); r['label']=sys.argv[1]; r['tree']=sys.argv[2]; r['args']=sys.argv[3]; print(json.dumps(r))" "$label" "$tree" "$*" >>"$OUT/bench.jsonl" \
      || { echo "FAILED $tree $label" | tee -a "$LOG"; tail -3 "$LOG"; }
}
for round in $(seq "${1:-1}"); do
    for tree in old new; do row $tree 7b-bf16 --model $B/qwen2.5-7b --random-weights --quant bf16; done
    for tree in old new; do row $tree 7b-awq --model $B/qwen2.5-7b --random-weights --quant awq --compile; done
    for tree in old new; do row $tree 8b-int8kv-32k --model $B/llama-3.1-8b --random-weights \
        --quant bf16 --kv-dtype int8 --prompt-len 32768 --new-tokens 64 --num-prompts 1; done
done
python3 - "$OUT/bench.jsonl" <<'PY' | tee "$OUT/compare.md"
import json, sys
rows = [json.loads(line) for line in open(sys.argv[1])]
print("| row | tree | decode tok/s | prefill tok/s | ttft ms |")
print("|---|---|---|---|---|")
for r in rows:
    print(f"| {r['label']} | {r['tree']} | {r.get('decode_tokens_per_s')} | "
          f"{r.get('prefill_tokens_per_s')} | {r.get('ttft_ms')} |")
PY
