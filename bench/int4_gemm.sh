#!/usr/bin/env bash
# One GPU, AWQ prefill: the GPU tests of the Triton GEMM over tinygemm's layout, the kernel
# sweep (int4_gemm.py), then `hearth bench` TTFT with random AWQ weights at 512, 4,096 and 32K
# tokens, the GEMM (HEARTH_INT4_PREFILL=fused) against unpack-then-cuBLAS and bf16, and AWQ at 16
# concurrent. Results under $OUT (log.txt, gemm_tests.txt, int4_gemm.jsonl / .md, bench.jsonl).
# Usage (repo root, carry [".whl"]): bash bench/int4_gemm.sh
set -u
source bench/device_env.sh
B=bench
Q=$B/qwen2.5-7b
echo "== GPU tests" | tee -a "$LOG"
timeout 240 python3 -m pytest -q -p no:cacheprovider tests/engine/kernels/test_int4_gemm_kernel.py \
    tests/engine/quant/test_awq.py -k "gpu or graph" >"$OUT/gemm_tests.txt" 2>&1
tail -5 "$OUT/gemm_tests.txt" | tee -a "$LOG"
echo "== kernels: int4_gemm.py --quick" | tee -a "$LOG"
timeout 240 python3 $B/int4_gemm.py --quick --models qwen2.5-7b --out "$OUT/int4_gemm.jsonl" \
    2>>"$LOG" | tee "$OUT/int4_gemm.md"
bench() {  # label, then hearth bench arguments (the environment passes through)
    local label=$1; shift
    echo "== $label: ${HEARTH_INT4_PREFILL:+HEARTH_INT4_PREFILL=$HEARTH_INT4_PREFILL }hearth bench $*" | tee -a "$LOG"
    if timeout "${LIMIT:-90}" python3 -m engine.cli.cli bench --out /tmp/r.json "$@" >>"$LOG" 2>&1; then
        python3 -c "import json,sys; r=json.load(open('/tmp/r.json')); r['label']=sys.argv[1]; r['args']=sys.argv[2]; print(json.dumps(r))" "$label" "$*" >>"$OUT/bench.jsonl"
        tail -4 "$LOG"
    else echo "FAILED $label" | tee -a "$LOG"; tail -5 "$LOG"; fi
}
for n in 512 4096; do
    bench 7b-bf16-$n --model $Q --random-weights --quant bf16 --prompt-len $n --new-tokens 32
    HEARTH_INT4_PREFILL=fused bench 7b-awq-fused-$n --model $Q --random-weights --quant awq --prompt-len $n --new-tokens 32
    HEARTH_INT4_PREFILL=unpack bench 7b-awq-unpack-$n --model $Q --random-weights --quant awq --prompt-len $n --new-tokens 32
done
LIMIT=150 bench 7b-bf16-32k --model $Q --random-weights --quant bf16 --prompt-len 32000 --new-tokens 16
LIMIT=150 HEARTH_INT4_PREFILL=fused bench 7b-awq-fused-32k --model $Q --random-weights --quant awq --prompt-len 32000 --new-tokens 16
LIMIT=300 bench 7b-awq-concurrency --model $Q --random-weights --quant awq --concurrency 1,16 \
    --prompt-len 512 --new-tokens 256 --repeats 3 --no-peer
