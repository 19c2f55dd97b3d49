#!/usr/bin/env bash
# One device call, engines side by side: each TREE runs the same `hearth bench` rows, row by row in
# turn (7B bf16, 7B AWQ compiled, the 8B shape's bf16 weights with an int8 or fp8 KV cache at a 1K or
# 32K prompt).
# A TREE is label=folder=cli-module: the working tree is new=.=engine.cli.cli; an older commit is
# unpacked beside it (and carried), e.g. for 7c5b653 (before the engine's layers):
#   mkdir old-7c5b653 && git archive 7c5b653 engine pyproject.toml | tar -x -C old-7c5b653
# and passed as old=old-7c5b653=engine.serve.cli. Demo models are byte-identical across these commits and
# are copied in from hearth_resources/ where a tree lacks them.
# Usage (repo root, carry [".whl", <trees>]): ROWS="7b-bf16 7b-awq 8b-int8kv-32k" \
#   bash bench/compare_trees.sh TREE...
# ROUNDS=N repeats the whole alternation N times; PIN=0-1 runs each bench on those CPUs only (the
# CPU rows: SmolLM2-135M's shape on two cores, as on the development machine).
set -u
source bench/device_env.sh
B=$PWD/bench  # absolute: each tree runs from its own folder
ROOT=$PWD
args_of() {
    case $1 in
    7b-bf16) echo "--model $B/qwen2.5-7b --random-weights --quant bf16" ;;
    7b-awq) echo "--model $B/qwen2.5-7b --random-weights --quant awq --compile" ;;
    8b-int8kv-32k) echo "--model $B/llama-3.1-8b --random-weights --quant bf16 --kv-dtype int8 --prompt-len 32768 --new-tokens 64 --num-prompts 1" ;;
    8b-fp8kv-32k) echo "--model $B/llama-3.1-8b --random-weights --quant bf16 --kv-dtype fp8 --prompt-len 32768 --new-tokens 64 --num-prompts 1" ;;
    8b-int8kv-1k) echo "--model $B/llama-3.1-8b --random-weights --quant bf16 --kv-dtype int8 --prompt-len 1024 --new-tokens 128 --num-prompts 2" ;;
    smollm2-cpu-b1) echo "--model $B/smollm2-135m --random-weights --device cpu --quant bf16 --prompt-len 32 --new-tokens 64 --num-prompts 3 --no-peer" ;;
    smollm2-cpu-c8) echo "--model $B/smollm2-135m --random-weights --device cpu --quant bf16 --prompt-len 32 --new-tokens 32 --concurrency 8 --repeats 1 --no-peer" ;;
    8b-fp8kv-1k) echo "--model $B/llama-3.1-8b --random-weights --quant bf16 --kv-dtype fp8 --prompt-len 1024 --new-tokens 128 --num-prompts 2" ;;
    esac
}
for tree in "$@"; do
    IFS== read -r label dir module <<<"$tree"
    [ -d "$dir/resources" ] || [ -d "$dir/hearth_resources" ] || {
        mkdir -p "$dir/resources" "$dir/hearth_resources"
        cp -r hearth_resources/. "$dir/resources/"; cp -r hearth_resources/. "$dir/hearth_resources/"; }
done
for round in $(seq "${ROUNDS:-1}"); do
for row in ${ROWS:-7b-bf16 7b-awq 8b-int8kv-32k}; do
    for tree in "$@"; do
        IFS== read -r label dir module <<<"$tree"
        echo "== $label $row: hearth bench $(args_of $row)" | tee -a "$LOG"
        # shellcheck disable=SC2046
        (cd "$dir" && PYTHONPATH=/tmp/site:$(cd "$dir" && pwd) timeout 170 ${PIN:+taskset -c $PIN} python3 -m "$module" bench \
            --out /tmp/r.json $(args_of $row)) >>"$LOG" 2>&1 \
          && python3 -c "import json,sys; r=json.load(open('/tmp/r.json')); r['label']=sys.argv[1]; r['tree']=sys.argv[2]; print(json.dumps(r))" "$row" "$label" >>"$OUT/bench.jsonl" \
          || { echo "FAILED $label $row" | tee -a "$LOG"; tail -3 "$LOG"; }
    done
done
done
cd "$ROOT"
python3 - "$OUT/bench.jsonl" <<'PY' | tee "$OUT/compare.md"
import json, sys
rows = [json.loads(line) for line in open(sys.argv[1])]
print("| row | tree | decode tok/s | prefill tok/s | ttft ms |")
print("|---|---|---|---|---|")
for r in rows:
    if "rows" in r:  # --concurrency: the last N's aggregate decode and TTFT p50
        last = r["rows"][-1]
        print(f"| {r['label']} (N={last['concurrency']}) | {r['tree']} | "
              f"{last['aggregate_decode_tokens_per_s']} | | {last['ttft_ms_p50']} |")
        continue
    print(f"| {r['label']} | {r['tree']} | {r.get('decode_tokens_per_s')} | "
          f"{r.get('prefill_tokens_per_s')} | {r.get('ttft_ms')} |")
PY
