#!/usr/bin/env bash
# The whole H200 benchmark in one call (device tool): graph-vs-eager checks, then `hearth bench`
# for the DESIGN.md shapes. Results land in $OUT as JSON lines; the table is printed last.
# Usage (repo root, bitsandbytes wheel carried in .whl): bash packaging/bench/h200.sh [quick]
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site:$PWD
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$OUT/device.txt"
python3 -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__)" | tee -a "$OUT/device.txt"
B=packaging/bench
bench() {  # label, then hearth bench arguments
    local label=$1; shift
    echo "== $label: hearth bench $*"
    timeout 300 python3 -m engine.cli bench --json "$@" 2>"$OUT/err-$label.txt" \
        | sed "s/^{/{\"label\": \"$label\", \"args\": \"$*\", /" | tee -a "$OUT/bench.jsonl" \
        || tail -5 "$OUT/err-$label.txt"
}
for q in bf16 nf4; do
    timeout 200 python3 $B/graph_check.py $B/qwen2.5-0.5b $q | tee -a "$OUT/graph_check.jsonl"
done
timeout 200 python3 $B/graph_check.py $B/qwen2.5-7b bf16 | tee -a "$OUT/graph_check.jsonl"
bench 05b-bf16 --model $B/qwen2.5-0.5b --random-weights --quant bf16 --baseline-hf
bench 05b-bf16-compile --model $B/qwen2.5-0.5b --random-weights --quant bf16 --compile
bench 7b-bf16 --model $B/qwen2.5-7b --random-weights --quant bf16 --baseline-hf
bench 7b-bf16-compile --model $B/qwen2.5-7b --random-weights --quant bf16 --compile
bench 7b-nf4 --model $B/qwen2.5-7b --random-weights --quant nf4 --baseline-hf
bench 05b-nf4 --model $B/qwen2.5-0.5b --random-weights --quant nf4
bench 7b-bf16-ttft4k --model $B/qwen2.5-7b --random-weights --quant bf16 --prompt-len 4096 --new-tokens 8 --num-prompts 1 --baseline-hf
bench 7b-bf16-ttft32k --model $B/qwen2.5-7b --random-weights --quant bf16 --prompt-len 32000 --new-tokens 8 --num-prompts 1
python3 $B/summarize.py "$OUT/bench.jsonl" | tee "$OUT/summary.md"
