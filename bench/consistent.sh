#!/usr/bin/env bash
# The decode-attention kernel's "consistent" setting (the default since 2026-11-29: a one-token
# step and a verify block split the keys alike), on one GPU in one call of the device tool:
# about 6 minutes. 1. GPU tests (fused pieces, graph over int8/fp8, speculative); 2. steps
# against verify blocks (verify_consistency.py), consistent and split per pass; 3. what it costs
# plain decode: 7B bf16 at a 1,100-token prompt (just past a granule: the most idle splits) and
# at 16K, consistent against per pass; 4. speculation at synthetic acceptance 0.5-0.9, K = 4.
# Results: $OUT/pytest.txt, consistency.jsonl, plain.jsonl, spec.jsonl, summary.md, log.txt.
set -u
source bench/device_env.sh
B=bench
timeout 150 python3 -m pytest -q -p no:cacheprovider -rf --tb=short tests/engine/models/test_fused_ops.py \
    tests/engine/cache/test_quantized_kv.py -k "gpu or triton or graph or fused" \
    2>&1 | tail -40 | tee "$OUT/pytest.txt"
echo "== verify_consistency.py" | tee -a "$LOG"
timeout 120 python3 $B/verify_consistency.py --model $B/qwen2.5-7b --backends triton triton-per-pass \
    >"$OUT/consistency.jsonl" 2>>"$LOG"; cat "$OUT/consistency.jsonl"
run() {  # jsonl, label, then hearth bench arguments
    local out=$1 label=$2; shift 2
    echo "== $label: hearth bench $*" | tee -a "$LOG"
    if timeout 90 python3 -m engine.cli.cli bench --out /tmp/r.json "$@" >>"$LOG" 2>&1; then
        python3 -c "import json,sys; r=json.load(open('/tmp/r.json')); r['label']=sys.argv[1]; r['args']=sys.argv[2]; r['config']=sys.argv[3]; print(json.dumps(r))" "$label" "$*" "${HEARTH_DECODE_ATTENTION_CONFIG:-}" >>"$OUT/$out"
    else echo "FAILED $label" | tee -a "$LOG"; tail -3 "$LOG"; fi
}
M="--model $B/qwen2.5-7b --random-weights --quant bf16"
for L in 1100 16000; do
    run plain.jsonl "7b-bf16-p$L-consistent" $M --prompt-len $L --new-tokens 256 --num-prompts 2
    HEARTH_DECODE_ATTENTION_CONFIG='{"consistent": false}' \
        run plain.jsonl "7b-bf16-p$L-per-pass" $M --prompt-len $L --new-tokens 256 --num-prompts 2
done
python3 - "$OUT/plain.jsonl" <<'PY' | tee "$OUT/summary.md"
import json, sys
print("| label | decode tok/s | roofline | TTFT ms |\n|---|---|---|---|")
for line in open(sys.argv[1]):
    r = json.loads(line)
    print(f"| {r['label']} | {r.get('decode_tokens_per_s')} | {r.get('roofline_tokens_per_s')} | {r.get('ttft_ms')} |")
PY
PAIR="--model $B/qwen2.5-7b --random-weights --quant bf16 --draft $B/qwen2.5-0.5b --new-tokens 128"
for A in 0.8 0.5 0.7 0.9; do
    run spec.jsonl "7b-05b-alpha$A-k4" $PAIR --synthetic-acceptance $A --num-speculative-tokens 4
done
python3 $B/summarize.py --speculative "$OUT/spec.jsonl" | tee -a "$OUT/summary.md"
