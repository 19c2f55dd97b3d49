#!/usr/bin/env bash
# One GPU: the TTFT with prefill chunks replayed as CUDA graphs (step/prefill_graphs.py):
# the GPU tests; `hearth bench` TTFT rows for the Qwen2.5-7B shape in bf16 and AWQ at 512 tokens,
# graphs on and off (HEARTH_PREFILL_GRAPHS) in the same call; the same with --compile (prefill
# chunks now run the engine's step there too); prefill_host.py's split of one prefill.
# Parts: tests, ttft, compile, host (default: tests ttft). Results under $OUT.
set -u
source bench/device_env.sh
B=bench
Q=$B/qwen2.5-7b
export LIMIT=${LIMIT:-150}
for part in ${*:-tests ttft}; do
case "$part" in
tests)
    timeout 300 python3 -m pytest -q -p no:cacheprovider tests/engine/step/test_prefill_graphs_gpu.py \
        2>&1 | tail -20 | tee "$OUT/tests.txt" ;;
ttft)  # graphs on and off
    A="--model $Q --random-weights --prompt-len 512 --new-tokens 32 --no-peer"
    for q in bf16 awq; do
        bench 7b-$q-512 $A --quant $q
        HEARTH_PREFILL_GRAPHS=off bench 7b-$q-512-eager $A --quant $q
    done ;;
compile)
    for q in bf16 awq; do
        bench 7b-$q-512-compile --model $Q --random-weights --quant $q --prompt-len 512 --new-tokens 64 --compile --no-peer
    done ;;
host)
    timeout 240 python3 $B/prefill_host.py --model $Q --quant awq bf16 2>&1 | tee "$OUT/host.txt" | tail -40 ;;
*) echo "unknown part $part" >&2; exit 2 ;;
esac
done
