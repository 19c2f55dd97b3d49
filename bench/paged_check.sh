#!/usr/bin/env bash
# The paged KV cache on one GPU, before it replaces the flat cache's measured figures:
# each step under its own `timeout`, in order of need, about 9 minutes for all:
#  1. the GPU tests of every path the block table touches (kernel against reference, graph
#     against eager, the fused write, speculative verify blocks, AWQ decode), ~3 min;
#  2. the TTFT targets (prefix_ttft.py, Qwen2.5-7B shape, bf16), ~1.5 min;
#  3. decode end to end through the paged kernel (kv_e2e.py, Llama-3.1-8B shape, AWQ weights:
#     compare with BENCHMARKS.md's flat-cache rows), ~3 min;
#  4. the planner against NVML again (plan_check.py: the arena adds a scratch block and the
#     prefill's gathered copy), ~2.5 min.
# STEPS="2 3" runs only those. Results in $OUT: log.txt, pytest.txt, ttft.md/.jsonl, e2e.md/.jsonl,
# plan_check.md/.jsonl. Usage (repo root, wheels in .whl as for decode_by_format.sh): bash bench/paged_check.sh
set -u
source bench/device_env.sh
B=bench
STEPS=${STEPS:-1 2 3 4}
want() { [[ " $STEPS " == *" $1 "* ]]; }
step() { echo "== $1 ($(date +%T))" | tee -a "$LOG"; }

if want 1; then step "1. GPU tests"
timeout 200 python3 -m pytest -q -p no:cacheprovider -rs tests/engine/cache/test_quantized_kv.py \
    tests/engine/kernels/test_kv_write_kernel.py tests/engine/kernels/test_paged_decode_kernel.py \
    tests/engine/spec/test_speculative.py tests/engine/cache/test_prefix_cache.py \
    >"$OUT/pytest.txt" 2>&1
echo "pytest exit $?: $(tail -1 "$OUT/pytest.txt")" | tee -a "$LOG"; fi

if want 2; then step "2. TTFT with reuse, Qwen2.5-7B shape, bf16"
timeout 150 python3 $B/prefix_ttft.py --model $B/qwen2.5-7b --quant bf16 --json "$OUT/ttft.jsonl" \
    >"$OUT/ttft.md" 2>>"$LOG" || echo "FAILED or cut short: ttft" | tee -a "$LOG"
cat "$OUT/ttft.md"; fi

if want 3; then step "3. end to end through the paged kernel, Llama-3.1-8B shape, AWQ"
timeout 220 python3 $B/kv_e2e.py --model $B/llama-3.1-8b --quant awq --runs 2 \
    --kv bf16 int8 fp8 --prompt-lens 1024 32768 --new-tokens 128 \
    --json "$OUT/e2e.jsonl" >"$OUT/e2e.md" 2>>"$LOG" || echo "FAILED or cut short: e2e" | tee -a "$LOG"
cat "$OUT/e2e.md"; fi

if want 4; then step "4. the planner against NVML"
PLAN_DEADLINE_S=200 timeout 210 python3 $B/plan_check.py --out "$OUT" >>"$LOG" 2>&1 \
    || echo "FAILED or cut short: plan_check" | tee -a "$LOG"
cat "$OUT/plan_check.md" 2>/dev/null; fi
step "done"
