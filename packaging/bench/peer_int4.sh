#!/usr/bin/env bash
# H200, issue 28's decode targets in one call: gpt-fast (its own model.py and quantize.py, random
# weights; gptfast_peer.py) in bf16 and int4 on the Llama-3.1-8B shape, and `hearth bench` on the
# same shape in bf16 and AWQ with an int4 lm_head (both sides quantize every linear, the lm_head
# included), then 7B AWQ and NF4 for the roofline and NF4-to-AWQ figures. Results under $OUT.
# Usage (repo root): copy gpt-fast's model.py and quantize.py into .peers/gpt-fast (git-ignored;
# `git --git-dir=<a gpt-fast clone>/.git show HEAD:model.py > .peers/gpt-fast/model.py`), carry
# [".whl", ".peers"] (.whl with the bitsandbytes wheel for NF4), then
#   bash packaging/bench/peer_int4.sh
set -u
source packaging/bench/device_env.sh
B=packaging/bench
peer() {
    echo "== gpt-fast $*" | tee -a "$LOG"
    timeout 240 python3 $B/gptfast_peer.py --gpt-fast .peers/gpt-fast --model llama-3.1-8b "$@" \
        2>>"$LOG" | tee -a "$OUT/peer.jsonl"
}
bench() {  # label, then hearth bench arguments
    local label=$1; shift
    echo "== $label: hearth bench $*" | tee -a "$LOG"
    if timeout "${LIMIT:-120}" python3 -m engine.serve.cli bench --out /tmp/r.json "$@" >>"$LOG" 2>&1; then
        python3 -c "import json,sys; r=json.load(open('/tmp/r.json')); r['label']=sys.argv[1]; r['args']=sys.argv[2]; print(json.dumps(r))" "$label" "$*" | tee -a "$OUT/bench.jsonl"
    else echo "FAILED $label" | tee -a "$LOG"; tail -5 "$LOG"; fi
}
L=$B/llama-3.1-8b
peer --int4
bench 8b-awq-lmhead-int4 --model $L --random-weights --quant awq --lm-head int4 --compile
peer
bench 8b-bf16 --model $L --random-weights --quant bf16 --compile
bench 7b-awq --model $B/qwen2.5-7b --random-weights --quant awq --compile
bench 7b-nf4 --model $B/qwen2.5-7b --random-weights --quant nf4 --compile
