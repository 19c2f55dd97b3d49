#!/usr/bin/env bash
# Quantized KV cache and the Triton decode-attention kernel on one GPU, in one call of
# the device tool: about 8 minutes; each step runs under `timeout` (11 minutes if all ran out),
# so one hang cannot take the rest, and the steps come in order of importance:
#  1. the GPU tests: the Triton kernel against the PyTorch reference, graph decode over int8/fp8
#     KV against the eager step (tests/engine/cache/test_quantized_kv.py, its CPU tests included);
#  2. one layer's decode attention at the Llama-3.1-8B shape (32/8 heads, dim 128) at 1K, 8K and
#     32K tokens: bf16 SDPA, and the Triton kernel over bf16, int8 and fp8 caches; then the
#     kernel's launch settings swept at 32K;
#  3. end to end, `hearth bench`'s measurement (engine/tools/bench/decode.py) over one random-weight
#     Llama-3.1-8B-shaped AWQ model (target: the fastest 4-bit weights, where the KV
#     read is the largest share of a step) at 1K- and 32K-token prompts: KV bf16, int8, fp8 (all
#     read by the Triton kernel) and bf16 read by SDPA (the default for 16-bit caches). One model
#     for all eight (kv_e2e.py); two timed runs each, since an AWQ prefill of 32K tokens takes
#     about 15 s (tinygemm at 512-token chunks);
#  4. the quality figures of kv_quality.py on the demo model, through the GPU path;
#  5. one `hearth bench` process through the CLI with an int8 cache (bf16 weights: built on the
#     GPU in seconds), the command-line path itself.
# Results ($OUT, 8 files at most): log.txt, pytest.txt, attention.md, attention.jsonl, e2e.md,
# e2e.jsonl, quality.md, cli_bench.json.
# Usage (repo root, bitsandbytes wheel in .whl as for decode_by_format.sh): bash bench/kv_speed.sh
# STEPS="1 3" runs only those steps (default: all five).
set -u
source bench/device_env.sh
B=bench
STEPS=${STEPS:-1 2 3 4 5}
want() { [[ " $STEPS " == *" $1 "* ]]; }
step() { echo "== $1 ($(date +%T))" | tee -a "$LOG"; }

if want 1; then step "1. GPU tests"
timeout ${T1:-240} python3 -m pytest -q -p no:cacheprovider -rfs --tb=short tests/engine/cache/test_quantized_kv.py \
    tests/engine/kernels/test_kv_write_kernel.py tests/engine/models/test_fused_ops.py tests/engine/spec/test_speculative.py \
    tests/engine/platform/test_engine_env.py \
    >"$OUT/pytest.txt" 2>&1
echo "pytest exit $?: $(tail -1 "$OUT/pytest.txt")" | tee -a "$LOG"; fi

if want 2; then step "2. decode attention, one layer"
timeout ${T2:-300} python3 $B/kv_attention_speed.py --sweep ${SWEEP:-launch} --json "$OUT/attention.jsonl" \
    >"$OUT/attention.md" 2>>"$LOG" || echo "FAILED or cut short: attention" | tee -a "$LOG"
cat "$OUT/attention.md"; fi

if want 3; then step "3. end to end, Llama-3.1-8B shape, AWQ weights"
timeout 330 python3 $B/kv_e2e.py --model $B/llama-3.1-8b --quant awq --runs 2 \
    --kv ${E2E_KV:-bf16-sdpa bf16 int8 fp8} --prompt-lens 1024 32768 --new-tokens 128 \
    --json "$OUT/e2e.jsonl" >"$OUT/e2e.md" 2>>"$LOG" || echo "FAILED or cut short: e2e" | tee -a "$LOG"
cat "$OUT/e2e.md"
# the sweep's fastest int8 setting at 32K, end to end over int8 and fp8 caches
BEST=$(python3 -c "import json,sys; r=[json.loads(l) for l in open(sys.argv[1])]; r=[x for x in r if x['config'] and 'us' in x]; print(json.dumps(min(r, key=lambda x: x['us'])['config']) if r else '')" "$OUT/attention.jsonl" 2>/dev/null)
if [ -n "$BEST" ]; then step "3b. end to end, int8/fp8 with the sweep's best setting $BEST"
HEARTH_DECODE_ATTENTION_CONFIG="$BEST" timeout 200 python3 $B/kv_e2e.py --model $B/llama-3.1-8b \
    --quant awq --runs 2 --kv int8 fp8 --prompt-lens 1024 32768 --new-tokens 128 \
    --json "$OUT/e2e_tuned.jsonl" 2>>"$LOG" | tail -8 | tee -a "$LOG"; fi; fi

if want 4; then step "4. quality on the demo model, GPU path"
timeout 80 python3 $B/kv_quality.py --device cuda --windows 8 >"$OUT/quality.md" 2>>"$LOG" \
    || echo "FAILED or cut short: quality" | tee -a "$LOG"
cat "$OUT/quality.md"; fi

if want 5; then step "5. hearth bench, int8 KV, through the CLI"
timeout 90 python3 -m engine.cli.cli bench --model $B/llama-3.1-8b --random-weights --quant bf16 \
    --kv-dtype int8 --prompt-len 32768 --new-tokens 64 --num-prompts 1 --out "$OUT/cli_bench.json" \
    >>"$LOG" 2>&1 || echo "FAILED or cut short: hearth bench" | tee -a "$LOG"; fi
step "done"
