#!/usr/bin/env bash
# One GPU, the 4-bit decode targets in one call: gpt-fast (its own model.py and quantize.py, random
# weights; gptfast_peer.py) in bf16 and int4 on the Llama-3.1-8B shape, and `hearth bench` on the
# same shape in bf16 and AWQ with an int4 lm_head (both sides quantize every linear, the lm_head
# included), then 7B AWQ and NF4 for the roofline and NF4-to-AWQ figures. Results under $OUT.
# Usage (repo root): copy gpt-fast's model.py and quantize.py into .peers/gpt-fast (git-ignored;
# `git --git-dir=<a gpt-fast clone>/.git show HEAD:model.py > .peers/gpt-fast/model.py`), carry
# [".whl", ".peers"] (.whl with the bitsandbytes wheel for NF4), then
#   bash bench/peer_int4.sh [steps]   (see the loop below; DEADLINE in seconds)
set -u
source bench/device_env.sh
B=bench
peer() {
    echo "== gpt-fast $*" | tee -a "$LOG"
    timeout 240 python3 $B/gptfast_peer.py --gpt-fast .peers/gpt-fast --model llama-3.1-8b "$@" \
        2>>"$LOG" | tee -a "$OUT/peer.jsonl"
}
L=$B/llama-3.1-8b
Q=$B/qwen2.5-7b
# steps (arguments; default all, in this order), each skipped once DEADLINE seconds have passed
for step in ${*:-peer-int4 8b-awq peer-bf16 8b-bf16 7b-awq 7b-bf16 7b-nf4}; do
    if [ "$SECONDS" -gt "${DEADLINE:-480}" ]; then echo "SKIPPED $step (deadline)" | tee -a "$LOG"; continue; fi
    case "$step" in
    peer-int4) peer --int4 ;;
    peer-bf16) peer ;;
    8b-awq) bench 8b-awq-lmhead-int4 --model $L --random-weights --quant awq --lm-head int4 --compile ;;
    8b-bf16) bench 8b-bf16 --model $L --random-weights --quant bf16 --compile ;;
    7b-awq) bench 7b-awq --model $Q --random-weights --quant awq --compile ;;
    7b-bf16) bench 7b-bf16 --model $Q --random-weights --quant bf16 --compile ;;
    7b-nf4) bench 7b-nf4 --model $Q --random-weights --quant nf4 --compile ;;
    esac
done
