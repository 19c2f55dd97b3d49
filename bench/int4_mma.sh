#!/usr/bin/env bash
# On one GPU: the CUDA int4 kernels' GPU tests, their sweep against tinygemm and bf16
# (int4_mma.py), then `hearth bench` AWQ with each int4 kernel beside bf16 (batch-1 decode, TTFT
# at 512 and 4,096 tokens). Results under $OUT. Parts: tests, sweep, e2e (default: all three).
set -u
source bench/device_env.sh
B=bench
parts=${*:-tests sweep e2e}
bench() {  # label, then hearth bench arguments
    local label=$1; shift
    echo "== $label: hearth bench $*" | tee -a "$LOG"
    if timeout "${LIMIT:-150}" python3 -m engine.cli.cli bench --model $B/qwen2.5-7b \
        --random-weights --out "$OUT/$label.json" "$@" >>"$LOG" 2>&1; then
        tail -6 "$LOG"
    else echo "FAILED $label" | tee -a "$LOG"; tail -20 "$LOG"; fi
}
for part in $parts; do
case "$part" in
tests)
    timeout 200 python3 -m pytest -q -p no:cacheprovider tests/engine/kernels/test_int4_mma_kernel.py \
        2>&1 | tail -15 | tee "$OUT/tests.txt" ;;
sweep)
    timeout ${SWEEP_LIMIT:-300} python3 $B/int4_mma.py --out "$OUT/mma.jsonl" ${SWEEP_ARGS:-} \
        2>>"$OUT/sweep_err.txt" | tee "$OUT/mma_table.md" ;;
e2e)  # KERNELS: the int4 kernels to compare (HEARTH_INT4_KERNEL), LENS: prompt lengths
    for len in ${LENS:-512}; do
        for k in ${KERNELS:-mma tinygemm}; do
            HEARTH_INT4_KERNEL=$k bench 7b-awq-$k-$len --quant awq --prompt-len $len --new-tokens 128
        done
        bench 7b-bf16-$len --quant bf16 --prompt-len $len --new-tokens 128
    done ;;
esac
done
