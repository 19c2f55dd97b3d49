#!/usr/bin/env bash
# One GPU, decode: launches folded into others (SiLU * up inside the int4 gate/up gemv;
# an earlier tree also merged decode attention's splits in the last program of each row tile, at
# 5d281a9, and dropped it). Parts: tests (the GPU tests of the kernels and the step), bench
# (`hearth bench --compile` rows, 7B AWQ, NF4 and bf16, 512-token prompts, 256 new tokens; AWQ
# also with the fused pieces off, which keeps the int4 products plain, in the same call),
# profile (int4_profile.py's kernels of a 7B AWQ step), ppl (nf4.sh's perplexity rows).
# Default: tests bench. Results under $OUT.
set -u
source bench/device_env.sh
B=bench
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
        tests/engine/kernels/test_batched_decode_kernel.py tests/engine/quant/test_int4_rows.py \
        $FAST 2>&1 | tail -25 | tee "$OUT/tests.txt" ;;
bench)  # SiLU * up in the gemv, and off (the pieces off)
    bench 7b-awq $A --quant awq
    HEARTH_FUSED_OPS=off bench 7b-awq-pieces-off $A --quant awq
    bench 7b-awq-again $A --quant awq
    bench 7b-nf4 $A --quant nf4 ;;
ppl)
    bash $B/nf4.sh ppl ;;
profile)
    timeout 200 python3 $B/int4_profile.py --model $Q --new-tokens 128 2>&1 | tee "$OUT/profile.txt" | tail -40 ;;
*) echo "unknown part $part" >&2; exit 2 ;;
esac
done
