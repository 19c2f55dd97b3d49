#!/usr/bin/env bash
# Prefill through the engine's own layer step and the decode kernel (HEARTH_KERNEL_PREFILL=all)
# against transformers' modules over SDPA for chunks past 64 tokens (the default), on one GPU in
# one call of the device tool: about 6 minutes. Written 2026-11-29 without a GPU: not yet run.
# (speculative.sh times speculation with the draft's prefill through the kernel.)
#  1. GPU tests of the kernel's prefill and short-prefill paths;
#  2. `hearth bench`, Qwen2.5-7B shape, bf16, 8 new tokens, 1 prompt: TTFT at 512, 4,096 and
#     32,000-token prompts, the default and all;
#  3. the TTFT targets (prefix_ttft.py), the default and all.
# Results: $OUT/pytest.txt, prefill.jsonl, ttft_default.jsonl, ttft_all.jsonl, summary.md,
# log.txt.
set -u
source bench/device_env.sh
B=bench
timeout 120 python3 -m pytest -q -p no:cacheprovider -rf --tb=short tests/engine/cache/test_quantized_kv.py \
    tests/engine/kernels/test_paged_decode_kernel.py -k "prefill or graph" 2>&1 | tail -20 | tee "$OUT/pytest.txt"
run() {  # jsonl, label, then hearth bench arguments
    local out=$1 label=$2; shift 2
    echo "== $label: hearth bench $*" | tee -a "$LOG"
    if timeout 100 python3 -m engine.cli.cli bench --out /tmp/r.json "$@" >>"$LOG" 2>&1; then
        python3 -c "import json,sys; r=json.load(open('/tmp/r.json')); r['label']=sys.argv[1]; print(json.dumps(r))" "$label" >>"$OUT/$out"
    else echo "FAILED $label" | tee -a "$LOG"; tail -3 "$LOG"; fi
}
M="--model $B/qwen2.5-7b --random-weights --quant bf16 --new-tokens 8 --num-prompts 1"
for L in 512 4096 32000; do
    run prefill.jsonl "7b-p$L-modules" $M --prompt-len $L
    HEARTH_KERNEL_PREFILL=all run prefill.jsonl "7b-p$L-kernel" $M --prompt-len $L
done
python3 $B/summarize.py "$OUT/prefill.jsonl" | tee "$OUT/summary.md"
for how in default all; do
    echo "== prefix_ttft.py, HEARTH_KERNEL_PREFILL=$how" | tee -a "$LOG"
    HEARTH_KERNEL_PREFILL=$([ $how = all ] && echo all) timeout 100 python3 $B/prefix_ttft.py \
        --model $B/qwen2.5-7b --quant bf16 --json "$OUT/ttft_$how.jsonl" 2>>"$LOG" | tee -a "$OUT/summary.md"
done
