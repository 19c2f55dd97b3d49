#!/usr/bin/env bash
# H200, issue 28's TTFT with prefill chunks replayed as CUDA graphs (step/prefill_graphs.py):
# the GPU tests; `hearth bench` TTFT rows for the Qwen2.5-7B shape in bf16 and AWQ at 512 tokens,
# graphs on and off (HEARTH_PREFILL_GRAPHS) in the same call; the same with --compile (prefill
# chunks now run the engine's step there too); prefill_host.py's split of one prefill.
# Parts: tests, ttft, compile, host (default: tests ttft). Results under $OUT.
set -u
source packaging/bench/device_env.sh
B=packaging/bench
Q=$B/qwen2.5-7b
export LIMIT=${LIMIT:-150}
for part in ${*:-tests ttft}; do
case "$part" in
tests)
    timeout 300 python3 -m pytest -q -p no:cacheprovider tests/engine/step/test_prefill_graphs_gpu.py \
        tests/engine/quant/test_int4_ahead_gpu.py 2>&1 | tail -20 | tee "$OUT/tests.txt" ;;
ttft)  # graphs on and off, and AWQ's graphs without the dequantizing ahead (quant/int4_ahead.py)
    A="--model $Q --random-weights --prompt-len 512 --new-tokens 32 --no-peer"
    for q in bf16 awq; do
        bench 7b-$q-512 $A --quant $q
        HEARTH_PREFILL_GRAPHS=off bench 7b-$q-512-eager $A --quant $q
    done
    echo "== 7b-awq-512-one-stream: no dequantizing ahead" | tee -a "$LOG"
    timeout "$LIMIT" python3 -c "import sys; from engine.quant import int4_ahead
int4_ahead.plan = lambda *a: None
from engine.serve import cli; sys.exit(cli.main(sys.argv[1:]))" bench --out /tmp/r1.json $A \
        --quant awq >>"$LOG" 2>&1 && python3 -c "import json; r=json.load(open('/tmp/r1.json'))
print(json.dumps(dict(label='7b-awq-512-one-stream', ttft_ms=r['ttft_ms'],
                      decode=r['decode_tokens_per_s'])))" | tee -a "$OUT/bench.jsonl" ;;
compile)
    for q in bf16 awq; do
        bench 7b-$q-512-compile --model $Q --random-weights --quant $q --prompt-len 512 --new-tokens 64 --compile --no-peer
    done ;;
host)
    timeout 240 python3 $B/prefill_host.py --model $Q --quant awq bf16 2>&1 | tee "$OUT/host.txt" | tail -40 ;;
*) echo "unknown part $part" >&2; exit 2 ;;
esac
done
