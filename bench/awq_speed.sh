#!/usr/bin/env bash
# AWQ on one GPU in one device call, about 7 minutes: the GPU tests of the int4 layer
# (kernels against the reference, CUDA-graph replay, graph vs eager decode), the kernel
# microbenchmark at 7B/8B shapes (awq_speed.py), then `hearth bench` with random AWQ weights per
# kernel, against bf16 and NF4, and with a quantized lm_head. Results in $OUT: log.txt,
# awq_tests.txt, awq_kernels.jsonl / .md, bench.jsonl, summary.md.
# Rows run in order of need, each under its own timeout, and summary.md is rewritten after each:
# a call cut short at its limit still returns what ran.
# Usage (repo root; .whl holds the bitsandbytes wheel, .whl/awq gptqmodel's, built here with
# `python3 -m pip wheel --no-deps -w .whl/awq gptqmodel==7.6.0`: PyPI has only its sdist):
#   bash bench/awq_speed.sh
set -u
source bench/device_env.sh
B=bench
echo "== GPU tests: tests/engine/quant/test_awq.py" | tee -a "$LOG"
timeout 100 python3 -m pytest -q -p no:cacheprovider tests/engine/quant/test_awq.py \
    tests/engine/tools/test_awq_quantize.py -k "gpu or graph" >"$OUT/awq_tests.txt" 2>&1; tail -3 "$OUT/awq_tests.txt" | tee -a "$LOG"
echo "== kernels: awq_speed.py" | tee -a "$LOG"
# gptqmodel's wheel sits apart in .whl/awq (device_env.sh installs .whl/*.whl for every script),
# on the path of this step alone: its package needs dependencies that are not carried
if ls .whl/awq/*.whl >/dev/null 2>&1; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target /tmp/site-awq .whl/awq/*.whl
fi
PYTHONPATH=/tmp/site-awq:$PYTHONPATH timeout 200 python3 $B/awq_speed.py \
    --out "$OUT/awq_kernels.jsonl" 2>>"$LOG" | tee "$OUT/awq_kernels.md"
bench() {  # label, then hearth bench arguments (the environment passes through)
    local label=$1; shift
    echo "== $label: ${HEARTH_INT4_KERNEL:+HEARTH_INT4_KERNEL=$HEARTH_INT4_KERNEL }hearth bench $*" | tee -a "$LOG"
    if timeout 75 python3 -m engine.cli.cli bench --out /tmp/r.json "$@" >>"$LOG" 2>&1; then
        python3 -c "import json,sys; r=json.load(open('/tmp/r.json')); r['label']=sys.argv[1]; r['args']=sys.argv[2]; print(json.dumps(r))" "$label" "$*" >>"$OUT/bench.jsonl"
        python3 $B/summarize.py "$OUT/bench.jsonl" >"$OUT/summary.md"  # so far, if time runs out
    else echo "FAILED $label" | tee -a "$LOG"; tail -3 "$LOG"; fi
}
Q=$B/qwen2.5-7b
HEARTH_INT4_KERNEL=tinygemm bench 7b-awq-tinygemm --model $Q --random-weights --quant awq --compile --baseline-hf
HEARTH_INT4_KERNEL=triton bench 7b-awq-triton --model $Q --random-weights --quant awq --compile
bench 7b-bf16 --model $Q --random-weights --quant bf16 --compile
HEARTH_INT4_KERNEL=tinygemm bench 7b-awq-lmhead-int8 --model $Q --random-weights --quant awq --compile --lm-head int8
bench 7b-nf4 --model $Q --random-weights --quant nf4 --compile
bench 7b-int8 --model $Q --random-weights --quant int8  # LLM.int8: eager (outlier threshold 6)
HEARTH_INT4_KERNEL=tinygemm bench 8b-awq-tinygemm --model $B/llama-3.1-8b --random-weights --quant awq --compile
HEARTH_INT4_KERNEL=tinygemm bench 7b-awq-lmhead-int4 --model $Q --random-weights --quant awq --compile --lm-head int4
cat "$OUT/summary.md"
