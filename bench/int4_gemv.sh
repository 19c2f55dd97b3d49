#!/usr/bin/env bash
# On one GPU, one call: the int4 kernels' GPU tests (the decode gemv, the mma kernel, the
# AWQ layer and its batched rows), the gemv's sweep (int4_gemv.py) at 1, 2 and 4 rows, then
# `hearth bench` 7B AWQ and bf16 at batch 1 (decode tokens/s, TTFT at 512). Results under $OUT.
# Parts: tests, sweep, e2e (default: all three).
set -u
source bench/device_env.sh
B=bench
for part in ${*:-tests sweep e2e}; do
case "$part" in
tests)
    timeout 240 python3 -m pytest -q -p no:cacheprovider tests/engine/kernels/test_int4_mma_kernel.py \
        tests/engine/quant/test_int4_rows.py tests/engine/quant/test_awq.py 2>&1 | tail -15 \
        | tee "$OUT/tests.txt" ;;
sweep)
    timeout 150 python3 $B/int4_gemv.py --rows 1 2 4 --out "$OUT/gemv.jsonl" ${SWEEP_ARGS:-} \
        2>>"$OUT/sweep_err.txt" | grep -v "tinygemm" | tee "$OUT/gemv_table.md" ;;
e2e)
    for q in awq bf16; do
        LIMIT=150 bench 7b-$q --model $B/qwen2.5-7b --random-weights --quant $q --prompt-len 512 \
            --new-tokens 256 --repeats 3 --no-peer
    done ;;
esac
done
