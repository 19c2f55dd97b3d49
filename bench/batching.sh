#!/usr/bin/env bash
# One GPU, continuous batching. Usage (repo root, carry [".whl"]):
#   bash bench/batching.sh tests    the GPU tests of the batched step and kernel
#   bash bench/batching.sh bf16     `hearth bench --concurrency 1,4,16,64`, 7B bf16,
#                                             transformers' generate_batch beside it
#   bash bench/batching.sh awq      the same for AWQ (no peer)
#   bash bench/batching.sh memory   64 requests of 4,096-token prompts under an
#                                             emulated 24 GiB card (7B bf16), NVML's peak
#   bash bench/batching.sh serve    1 and 16 streaming clients of the server
#                                             against the engine's own rounds (serve_speed.py);
#                                             carry the server's wheels in .whl too (pip download
#                                             for Python 3.12: fastapi starlette uvicorn click h11
#                                             pydantic pydantic-core typing-inspection
#                                             annotated-types prometheus-client openai httpx
#                                             httpcore anyio sniffio idna certifi distro jiter)
# Random weights, 512-token prompts, 256 new tokens, median of 3. Results under $OUT.
set -u
source bench/device_env.sh
B=bench
sweep() {  # label, then hearth bench arguments
    local label=$1; shift
    echo "== $label: hearth bench $*" | tee -a "$LOG"
    if timeout "${LIMIT:-300}" python3 -m engine.cli.cli bench --model $B/qwen2.5-7b \
        --random-weights --out "$OUT/$label.json" "$@" >>"$LOG" 2>&1; then
        tail -12 "$LOG"
    else echo "FAILED $label" | tee -a "$LOG"; tail -20 "$LOG"; fi
}
case "${1:-tests}" in
tests)
    timeout 400 python3 -m pytest -q -p no:cacheprovider tests/engine/generate/test_batch_run_gpu.py \
        tests/engine/kernels/test_batched_decode_kernel.py tests/engine/models/test_invariant_gpu.py \
        tests/engine/generate/test_batch_run.py tests/engine/generate/test_prefill_batch.py \
        tests/engine/generate/test_speculation_switch.py 2>&1 | tail -40 | tee -a "$LOG" ;;
bf16)
    LIMIT=540 sweep 7b-bf16-concurrency --quant bf16 --concurrency 1,4,16,64 --prompt-len 512 \
        --new-tokens 256 --repeats 3 ;;
awq)
    LIMIT=200 sweep 7b-awq-concurrency --quant awq --concurrency 1,4,16,64 --prompt-len 512 \
        --new-tokens 256 --repeats 3 --no-peer ;;
sweep64)  # bf16 at 64 beside batch 1, no peer
    LIMIT=${LIMIT:-200} sweep 7b-bf16-64 --quant bf16 --concurrency 64 --prompt-len 512 \
        --new-tokens 256 --repeats 3 --no-peer ;;
memory)
    LIMIT=330 sweep 7b-bf16-24gib --quant bf16 --memory-limit 24 --concurrency 64 \
        --prompt-len 4096 --new-tokens 256 --repeats 1 --no-peer ;;
serve)
    timeout 500 python3 $B/serve_speed.py --model $B/qwen2.5-7b --random-weights --quant bf16 \
        --clients 1,16 --prompt-len 512 --new-tokens 256 --repeats 3 2>>"$LOG" \
        | tee "$OUT/serve_speed.jsonl" ;;
esac
