#!/usr/bin/env bash
# Speculative decoding on one GPU in one call of the device tool; written without a
# GPU; its first run found the padded-vocabulary crash (ids past the draft's embedding). First the GPU-only tests (verify blocks captured as CUDA graphs, the bf16
# teacher-forced check), then `hearth bench`: the 7B target with the 0.5B draft (random weights,
# synthetic acceptance 0.3/0.5/0.7/0.8/0.9 at K = 4; with SPEC_MORE also K = 2/6 at 0.8, and
# 0.5/0.8 with the draft's prompt prefill through transformers' modules), the demo pair, and prompt
# lookup on copy tasks. Results: $OUT/pytest.txt, $OUT/spec.jsonl, $OUT/log.txt.
# Usage (repo root, bitsandbytes wheel in .whl as for decode_by_format.sh): bash bench/speculative.sh
set -u
source bench/device_env.sh
timeout 300 python3 -m pytest -q -p no:cacheprovider -rf --tb=short tests/engine/spec/test_speculative.py \
    tests/engine/spec/test_speculative_cli.py tests/engine/models/test_fused_ops.py \
    2>&1 | tail -60 | tee "$OUT/pytest.txt"
# the decode kernel (one compiled kernel for every query length) and graphs over quantized caches
timeout 200 python3 -m pytest -q -p no:cacheprovider -rf --tb=short tests/engine/cache/test_quantized_kv.py \
    -k "triton or compiled or graph or prefill" 2>&1 | tail -30 | tee -a "$OUT/pytest.txt"
B=bench
bench() {  # label, then hearth bench arguments
    local label=$1; shift
    echo "== $label: hearth bench $*" | tee -a "$LOG"
    if timeout 120 python3 -m engine.cli.cli bench --out /tmp/r.json "$@" >>"$LOG" 2>&1; then
        python3 -c "import json,sys; r=json.load(open('/tmp/r.json')); r['label']=sys.argv[1]; r['args']=sys.argv[2]; print(json.dumps(r))" "$label" "$*" >>"$OUT/spec.jsonl"
    else echo "FAILED $label" | tee -a "$LOG"; tail -3 "$LOG"; fi
}
# one-token steps against verify blocks, per decode-attention backend: the synthetic draft's
# acceptance depends on them agreeing (docs/benchmark-log.md, the second speculative GPU run)
echo "== verify_consistency.py" | tee -a "$LOG"
timeout 150 python3 $B/verify_consistency.py --model $B/qwen2.5-7b \
    --backends sdpa triton \
    >"$OUT/consistency.jsonl" 2>>"$LOG"; cat "$OUT/consistency.jsonl" | tee -a "$LOG"
PAIR="--model $B/qwen2.5-7b --random-weights --quant bf16 --draft $B/qwen2.5-0.5b --new-tokens 128"
# the kernel's "consistent" setting first (see verify_consistency.py), then the default
[ -n "${SPEC_MORE:-}" ] && HEARTH_DECODE_ATTENTION_CONFIG='{"consistent": true}' \
    bench 7b-05b-alpha0.8-k4-consistent $PAIR --synthetic-acceptance 0.8 --num-speculative-tokens 4
for A in 0.3 0.5 0.7 0.8 0.9; do
    bench "7b-05b-alpha$A-k4" $PAIR --synthetic-acceptance $A --num-speculative-tokens 4
done
[ -n "${SPEC_MORE:-}" ] && for A in 0.5 0.8; do  # the draft's prompt prefill through
    # transformers' modules, as before 2026-11-29's second session (an eager pass of about six
    # 7B steps on this host: 5% of a 128-token answer)
    HEARTH_KERNEL_PREFILL=0 bench "7b-05b-alpha$A-k4-modules-prefill" $PAIR \
        --synthetic-acceptance $A --num-speculative-tokens 4
done
# both models compiled (the fused Triton pieces are the default and were faster on 2026-11-29)
[ -n "${SPEC_MORE:-}" ] && bench 7b-05b-alpha0.8-k4-compile $PAIR --synthetic-acceptance 0.8 \
    --num-speculative-tokens 4 --compile
[ -n "${SPEC_MORE:-}" ] && for K in 2 6; do
    bench "7b-05b-alpha0.8-k$K" $PAIR --synthetic-acceptance 0.8 --num-speculative-tokens $K
done
bench demo-draft --draft hearth_resources/demo_draft --prompts $B/demo_questions.jsonl --new-tokens 128
bench demo-lookup --prompt-lookup --prompts $B/demo_copy.jsonl --new-tokens 128
python3 $B/summarize.py --speculative "$OUT/spec.jsonl" | tee "$OUT/summary.md"
