#!/usr/bin/env bash
# On one GPU, in one call of the device tool (about 8 minutes):
#  1. the GPU tests of the decode kernel's settings (test_quantized_kv.py, -k below);
#  2. the kernel's chunked table reads timed over bf16 and fp8 caches (int8's were timed in an
#     earlier call: `kv_attention_speed.py --sweep chunk`);
#  3. end to end (kv_e2e.py, Llama-3.1-8B shape, AWQ weights) with bf16 and int8 caches under the
#     committed defaults at 1K and 32K;
#  4. bf16 at 32K under step 2's fastest bf16 setting, if it beat the default: the int8/bf16
#     ratio is taken against the faster bf16.
# Results ($OUT): log.txt, pytest.txt, chunk.md, chunk.jsonl, e2e.md, e2e.jsonl,
# e2e_bf16_best.md/.jsonl.
# Usage (repo root, bitsandbytes wheel in .whl as for decode_by_format.sh): [STEPS="1 2 4"] bash
# bench/kv_chunk.sh
set -u
source bench/device_env.sh
B=bench
STEPS=${STEPS:-1 2 3 4}
want() { [[ " $STEPS " == *" $1 "* ]]; }
if want 1; then echo "== 1. GPU tests ($(date +%T))" | tee -a "$LOG"
timeout 200 python3 -m pytest -q -p no:cacheprovider -rfs --tb=short tests/engine/cache/test_quantized_kv.py \
    -k "settings or verify_blocks or triton_kernel or compiled or chunked or graph_decode" \
    >"$OUT/pytest.txt" 2>&1
echo "pytest exit $?: $(tail -1 "$OUT/pytest.txt")" | tee -a "$LOG"; fi
if want 2; then echo "== 2. sweep ($(date +%T))" | tee -a "$LOG"
timeout 120 python3 $B/kv_attention_speed.py --lengths 32768 --sweep chunk --dtypes bf16 fp8 \
    --json "$OUT/chunk.jsonl" >"$OUT/chunk.md" 2>>"$LOG" || echo "FAILED or cut short: sweep" | tee -a "$LOG"
sed -n '/sorted/,$p' "$OUT/chunk.md"; fi
if want 3; then echo "== 3. end to end ($(date +%T))" | tee -a "$LOG"
timeout 260 python3 $B/kv_e2e.py --model $B/llama-3.1-8b --quant awq --runs 2 --kv bf16 int8 \
    --prompt-lens 1024 32768 --new-tokens 128 --json "$OUT/e2e.jsonl" >"$OUT/e2e.md" 2>>"$LOG" \
    || echo "FAILED or cut short: e2e" | tee -a "$LOG"
cat "$OUT/e2e.md"; fi
if want 4; then BEST=$(python3 -c "
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
rows = [r for r in rows if r['kv_dtype'] == 'bf16' and r['impl'] == 'triton' and 'us' in r]
best = min(rows, key=lambda r: r['us'])
print(json.dumps(best['config']) if best['config'] else '')" "$OUT/chunk.jsonl" 2>/dev/null)
if [ -n "$BEST" ]; then echo "== 4. bf16 at 32K with $BEST ($(date +%T))" | tee -a "$LOG"
HEARTH_DECODE_ATTENTION_CONFIG="$BEST" timeout 150 python3 $B/kv_e2e.py --model $B/llama-3.1-8b \
    --quant awq --runs 2 --kv bf16 --prompt-lens 32768 --new-tokens 128 \
    --json "$OUT/e2e_bf16_best.jsonl" >"$OUT/e2e_bf16_best.md" 2>>"$LOG" \
    || echo "FAILED or cut short: bf16 best" | tee -a "$LOG"
cat "$OUT/e2e_bf16_best.md"; fi; fi
echo "== done ($(date +%T))" | tee -a "$LOG"
