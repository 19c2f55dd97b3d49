#!/usr/bin/env bash
# H200, issue 28's decode: launches folded into others (SiLU * up inside the int4 gate/up gemv;
# decode attention's splits merged by the last program of each row tile). Parts: tests (the GPU
# tests of the kernels and the step), bench (`hearth bench --compile` rows, 7B AWQ, NF4 and
# bf16, 512-token prompts, 256 new tokens; AWQ also with the merge off, through
# HEARTH_DECODE_ATTENTION_CONFIG, and with the fused pieces off, which keeps the int4 products
# plain, in the same call), profile (int4_profile.py's kernels of a 7B AWQ step).
# Default: tests bench. Results under $OUT.
set -u
source packaging/bench/device_env.sh
B=packaging/bench
Q=$B/qwen2.5-7b
export LIMIT=${LIMIT:-150}
FAST=tests/engine/models/test_fast_path.py
A="--model $Q --random-weights --prompt-len 512 --new-tokens 256 --compile --no-peer"
for part in ${*:-tests bench}; do
case "$part" in
tests)
    timeout ${TESTS_LIMIT:-400} python3 -m pytest -q -p no:cacheprovider \
        tests/engine/kernels/test_int4_mma_kernel.py tests/engine/quant/test_nf4_linear.py \
        tests/engine/models/test_fused_ops.py tests/engine/step/test_prefill_graphs_gpu.py \
        tests/engine/generate/test_batch_run_gpu.py tests/engine/cache/test_quantized_kv.py \
        tests/engine/kernels/test_paged_decode_kernel.py tests/engine/models/test_invariant_gpu.py \
        tests/engine/kernels/test_batched_decode_kernel.py $FAST 2>&1 | tail -25 | tee "$OUT/tests.txt" ;;
bench)  # the merge of decode attention's splits and SiLU * up on, and each off
    bench 7b-awq $A --quant awq
    HEARTH_DECODE_ATTENTION_CONFIG='{"merge": false}' bench 7b-awq-merge-off $A --quant awq
    HEARTH_FUSED_OPS=off bench 7b-awq-pieces-off $A --quant awq
    bench 7b-nf4 $A --quant nf4
    bench 7b-bf16 $A --quant bf16 ;;
profile)
    timeout 200 python3 $B/int4_profile.py --model $Q --new-tokens 128 2>&1 | tee "$OUT/profile.txt" | tail -40 ;;
*) echo "unknown part $part" >&2; exit 2 ;;
esac
done
