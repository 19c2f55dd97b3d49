#!/usr/bin/env bash
# The whole one-GPU benchmark in one call (device tool): graph-vs-eager checks, then `hearth bench`
# for the real model shapes in bench/. Results: $OUT/graph_check.jsonl, $OUT/bench.jsonl, $OUT/log.txt,
# and the table printed last. Usage (repo root, bitsandbytes wheel in .whl): bash bench/decode_by_format.sh
# [full | fused | triton]  (triton: the fused step pieces against PyTorch's, about 4 minutes)
set -u
source bench/device_env.sh
B=bench
check() { timeout 240 python3 $B/graph_check.py "$@" 2>>"$LOG" | tee -a "$OUT/graph_check.jsonl"; }
bench() {  # label, then hearth bench arguments
    local label=$1; shift
    echo "== $label: hearth bench $*" | tee -a "$LOG"
    if timeout 300 python3 -m engine.cli.cli bench --out /tmp/r.json "$@" >>"$LOG" 2>&1; then
        python3 -c "import json,sys; r=json.load(open('/tmp/r.json')); r['label']=sys.argv[1]; r['args']=sys.argv[2]; print(json.dumps(r))" "$label" "$*" >>"$OUT/bench.jsonl"
    else echo "FAILED $label" | tee -a "$LOG"; tail -3 "$LOG"; fi
}
case "${1:-full}" in
full)
    check $B/qwen2.5-0.5b bf16; check $B/qwen2.5-0.5b fp32; check $B/qwen2.5-0.5b nf4
    check $B/qwen2.5-7b bf16; check $B/qwen2.5-7b nf4
    bench 05b-bf16 --model $B/qwen2.5-0.5b --random-weights --quant bf16 --baseline-hf
    bench 05b-bf16-compile --model $B/qwen2.5-0.5b --random-weights --quant bf16 --compile
    bench 7b-bf16 --model $B/qwen2.5-7b --random-weights --quant bf16 --baseline-hf
    bench 7b-bf16-compile --model $B/qwen2.5-7b --random-weights --quant bf16 --compile
    bench 7b-nf4 --model $B/qwen2.5-7b --random-weights --quant nf4 --baseline-hf
    bench 7b-nf4-compile --model $B/qwen2.5-7b --random-weights --quant nf4 --compile
    bench 05b-nf4 --model $B/qwen2.5-0.5b --random-weights --quant nf4
    bench 7b-bf16-ttft4k --model $B/qwen2.5-7b --random-weights --quant bf16 --prompt-len 4096 --new-tokens 8 --num-prompts 1 --baseline-hf
    bench 7b-bf16-ttft32k --model $B/qwen2.5-7b --random-weights --quant bf16 --prompt-len 32000 --new-tokens 8 --num-prompts 1 ;;
fused)  # after fusing the pieces between linears (NF4 too) and planner-sized prefill passes
    bench 7b-bf16 --model $B/qwen2.5-7b --random-weights --quant bf16
    bench 7b-bf16-compile --model $B/qwen2.5-7b --random-weights --quant bf16 --compile --baseline-hf
    bench 7b-nf4-compile --model $B/qwen2.5-7b --random-weights --quant nf4 --compile
    bench 05b-bf16-compile --model $B/qwen2.5-0.5b --random-weights --quant bf16 --compile
    bench 7b-bf16-ttft4k --model $B/qwen2.5-7b --random-weights --quant bf16 --compile --prompt-len 4096 --new-tokens 8 --num-prompts 1 --baseline-hf ;;
triton)  # the step's small pieces as one Triton launch each (norms, SiLU * up, RoPE with the
    # K/V stores: the default since fused_ops.py) against PyTorch's pieces (HEARTH_FUSED_OPS=off)
    # and against --compile; GPU tests first
    timeout 200 python3 -m pytest -q -p no:cacheprovider tests/engine/models/test_fused_ops.py \
        tests/engine/cache/test_quantized_kv.py -k "fused or short_prefill or graph" 2>&1 | tail -3 | tee -a "$LOG"
    bench 7b-bf16-fused --model $B/qwen2.5-7b --random-weights --quant bf16 --baseline-hf
    HEARTH_FUSED_OPS=off bench 7b-bf16-pytorch-pieces --model $B/qwen2.5-7b --random-weights --quant bf16
    bench 7b-bf16-compile --model $B/qwen2.5-7b --random-weights --quant bf16 --compile
    bench 05b-bf16-fused --model $B/qwen2.5-0.5b --random-weights --quant bf16
    HEARTH_FUSED_OPS=off bench 05b-bf16-pytorch-pieces --model $B/qwen2.5-0.5b --random-weights --quant bf16 ;;
esac
python3 $B/summarize.py "$OUT/bench.jsonl" | tee "$OUT/summary.md"
