#!/usr/bin/env bash
# NF4 on one GPU, one call: the codebook kernels' GPU tests, the demo model's
# perplexity on its held-out text through the new kernels and through the ones they replace (NF4:
# the engine's layer against bitsandbytes'; AWQ, an RTN copy: gemv and mma against tinygemm),
# then `hearth bench` 7B NF4 (the engine's layer and bitsandbytes') beside AWQ. Carry [".whl"]
# (bitsandbytes). Results under $OUT. Parts: tests, ppl, bench (default: all three).
set -u
source bench/device_env.sh
B=bench
for part in ${*:-tests ppl bench}; do
case "$part" in
tests)
    timeout 150 python3 -m pytest -q -p no:cacheprovider tests/engine/quant/test_nf4_linear.py \
        tests/engine/kernels/test_int4_mma_kernel.py -k "not every_gemv_launch" 2>&1 | tail -8 \
        | tee "$OUT/tests.txt" ;;
ppl)
    T=packaging/demo_model/heldout.txt
    timeout 60 python3 -m engine.cli.cli quantize --method rtn --out /tmp/demo-rtn \
        --device cuda >>"$LOG" 2>&1
    row() { echo "== ppl $*" >>"$LOG"; timeout 60 python3 -m engine.cli.cli eval --text "$T" \
        --json "$@" 2>>"$LOG" \
        | tee -a "$OUT/ppl.jsonl"; }
    row --quant bf16
    row --quant nf4
    HEARTH_INT4_KERNEL=reference row --quant nf4
    row --model /tmp/demo-rtn
    HEARTH_INT4_KERNEL=tinygemm row --model /tmp/demo-rtn ;;
bench)
    Q=$B/qwen2.5-7b
    bench 7b-nf4 --model $Q --random-weights --quant nf4 --compile
    HEARTH_INT4_KERNEL=reference bench 7b-nf4-bitsandbytes --model $Q --random-weights --quant nf4 --compile
    bench 7b-awq --model $Q --random-weights --quant awq --compile ;;
esac
done
