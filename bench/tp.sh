#!/usr/bin/env bash
# Tensor parallelism on two GPUs in one call of the device tool (a two-GPU machine)
# (`check` and `exact` ran 2026-11-29: BENCHMARKS.md). Random weights with real shapes (bench/):
#   1. tp_check.py, Qwen2.5-7B bf16, with and without --compile: teacher-forced tp=2 against the
#      one-GPU fast path (logits within bf16 rounding: "agrees"), then decode tokens/s of each
#      ("speedup", target >= 1.6x);
#   2. tp_check.py, the Qwen2.5-14B shape under a 24 GiB per-GPU cap (too big for one such card):
#      NVML's peak per GPU against the planner's prediction ("plan_error_per_gpu", target 7%);
#   3. the CLI path: `hearth bench --tensor-parallel 2` and 1 on the 7B (compiled), the 14B under
#      24 GiB, `hearth run --tensor-parallel 2` against 1 on the bundled demo model (real weights),
#      and `hearth plan --gpu auto` for the 14B on this machine.
# Results: $OUT/tp_check.jsonl, $OUT/bench.jsonl, $OUT/run_tp{1,2}.jsonl, $OUT/summary.md,
# $OUT/log.txt. A hang leaves every rank's stacks in the log. Usage (repo root, bitsandbytes
# wheel in .whl as for decode_by_format.sh):
#   bash bench/tp.sh          # all of it, about 9 minutes
#   bash bench/tp.sh speed    # 1 compiled only, about 1.5 minutes
#   bash bench/tp.sh exact    # the 7B in fp32 against one GPU, and 2
#   bash bench/tp.sh diag     # the 0.5B shape only
#   bash bench/tp.sh check    # 1 and 2;   bash bench/tp.sh cli   # 3 only
#   bash bench/tp.sh fused    # 1 uncompiled, the CLI's bench at tp 2 and 1, the demo
#   bash bench/tp.sh allreduce  # 1 uncompiled with the all-reduce chosen, then NCCL's
set -u
source bench/device_env.sh
# multicast stays off in every process (the device's KINDS.md); NVML and CUDA count GPUs alike
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export CUDA_DEVICE_ORDER=PCI_BUS_ID NCCL_DEBUG=${NCCL_DEBUG:-WARN}
B=bench
nvidia-smi topo -m >>"$LOG" 2>&1
check() {  # label, seconds allowed, then tp_check.py arguments; a hang leaves every rank's stacks
    local label=$1 limit=$2; shift 2
    echo "== $label: tp_check.py $*" | tee -a "$LOG"
    rm -f /tmp/tp.json /tmp/hearth-tp-rank*.log
    python3 $B/tp_check.py "$@" --json /tmp/tp.json >>"$LOG" 2>&1 &
    local pid=$! t=0
    while kill -0 $pid 2>/dev/null && [ $t -lt "$limit" ]; do sleep 1; t=$((t + 1)); done
    if kill -0 $pid 2>/dev/null; then
        echo "HUNG $label after $limit s; the stacks of every rank follow" | tee -a "$LOG"
        pkill -USR1 -f engine.parallel.follower; kill -USR1 $pid; sleep 3
        pkill -9 -f engine.parallel.follower; kill -9 $pid
    fi
    wait $pid
    for f in /tmp/hearth-tp-rank*.log; do [ -s "$f" ] && { echo "-- $f"; cat "$f"; } >>"$LOG"; done
    if [ -s /tmp/tp.json ]; then
        python3 -c "import json,sys; r=json.load(open('/tmp/tp.json')); r['label']=sys.argv[1]; print(json.dumps(r))" "$label" >>"$OUT/tp_check.jsonl"
    else echo "FAILED $label" | tee -a "$LOG"; tail -5 "$LOG"; fi
}
bench() {  # label, then hearth bench arguments
    local label=$1; shift
    echo "== $label: hearth bench $*" | tee -a "$LOG"
    if timeout 200 python3 -m engine.cli.cli bench --out /tmp/r.json "$@" >>"$LOG" 2>&1; then
        python3 -c "import json,sys; r=json.load(open('/tmp/r.json')); r['label']=sys.argv[1]; r['args']=sys.argv[2]; print(json.dumps(r))" "$label" "$*" >>"$OUT/bench.jsonl"
    else echo "FAILED $label" | tee -a "$LOG"; tail -5 "$LOG"; fi
}
run_demo() {  # tensor-parallel size: the bundled demo model, greedy, one JSON event a line
    echo "== hearth run --tensor-parallel $1 (demo model)" | tee -a "$LOG"
    timeout 90 python3 -m engine.cli.cli run --prompt "Write a Python function that reverses a list." \
        --temperature 0 --max-new-tokens 64 --json --tensor-parallel "$1" \
        >"$OUT/run_tp$1.jsonl" 2>>"$LOG" || echo "FAILED run tp=$1" | tee -a "$LOG"
}
case "${1:-full}" in fused)  # since the fused step pieces (the one-GPU default): uncompiled, both
    check 7b-tp2-vs-1-fused 150 $B/qwen2.5-7b --tp 2
    bench 7b-bf16-tp2-fused --model $B/qwen2.5-7b --random-weights --quant bf16 --tensor-parallel 2
    bench 7b-bf16-tp1-fused --model $B/qwen2.5-7b --random-weights --quant bf16
    run_demo 1; run_demo 2 ;;
esac
case "${1:-full}" in allreduce)  # the all-reduce chosen at setup (tp_all_reduce.py) against NCCL's
    check 7b-tp2-vs-1-auto 150 $B/qwen2.5-7b --tp 2
    HEARTH_TP_ALL_REDUCE=nccl check 7b-tp2-vs-1-nccl 150 $B/qwen2.5-7b --tp 2 ;;
esac
case "${1:-full}" in diag)  # the smallest shape, quickly: does the lockstep run at all
    check 05b-tp2-vs-1 90 $B/qwen2.5-0.5b --tp 2 --steps 32 --new-tokens 64 ;;
esac
case "${1:-full}" in exact)  # the cut's math in fp32, and the 14B that no 24 GiB card holds
    check 7b-fp32-tp2-vs-1 130 $B/qwen2.5-7b --tp 2 --dtype fp32
    check 14b-tp2-24gib 150 $B/qwen2.5-14b --tp 2 --memory-limit 24 --no-reference ;;
esac
case "${1:-full}" in full|check|speed)  # against the one-GPU fast path at its fastest: compiled
    check 7b-tp2-vs-1-compiled 200 $B/qwen2.5-7b --tp 2 --compile ;;
esac
case "${1:-full}" in full|check)
    check 7b-tp2-vs-1 150 $B/qwen2.5-7b --tp 2
    check 14b-tp2-24gib 170 $B/qwen2.5-14b --tp 2 --memory-limit 24 --no-reference ;;
esac
case "${1:-full}" in full|cli)
    rm -f /tmp/r.json
    bench 7b-bf16-tp2 --model $B/qwen2.5-7b --random-weights --quant bf16 --tensor-parallel 2 --compile
    bench 7b-bf16-tp1 --model $B/qwen2.5-7b --random-weights --quant bf16 --compile
    bench 14b-bf16-tp2-24gib --model $B/qwen2.5-14b --random-weights --quant bf16 \
        --tensor-parallel 2 --memory-limit 24 --prompt-len 512 --new-tokens 128 --num-prompts 2
    run_demo 1; run_demo 2
    timeout 30 python3 -m engine.cli.cli plan --model $B/qwen2.5-14b --gpu auto --context 8192 \
        --tensor-parallel 2 2>&1 | tee -a "$LOG" ;;
esac
python3 - "$OUT" <<'EOF' | tee "$OUT/summary.md"
import json, os, sys
out = sys.argv[1]
def lines(name):  # JSON lines; anything else on a --json stdout breaks the CLI contract: said
    path = os.path.join(out, name)
    rows = []
    for l in (open(path) if os.path.exists(path) else []):
        try:
            rows.append(json.loads(l)) if l.strip() else None
        except ValueError:
            print(f"NOT JSON in {name}: {l.strip()[:120]}")
    return rows
print("| tp_check | tp tok/s | 1-GPU tok/s | speedup | agrees (1e-2) | within yardstick | NVML peak GiB/GPU | planned GiB/GPU (less margin) | error |")
print("|---|---|---|---|---|---|---|---|---|")
for r in lines("tp_check.jsonl"):
    gib = lambda v: "-" if v is None else (", ".join(f"{x / 2**30:.2f}" for x in v) if isinstance(v, list) else f"{v / 2**30:.2f}")
    print(f"| {r['label']} | {r.get('tp_tokens_per_s', '-')} | {r.get('one_gpu_tokens_per_s', '-')} | "
          f"{r.get('speedup', '-')} | {r.get('agrees', '-')} | {r.get('within_yardstick', '-')} | "
          f"{gib(r.get('nvml_peak_bytes_per_gpu'))} | "
          f"{gib(r.get('predicted_used_bytes_per_gpu'))} | {r.get('plan_error_per_gpu', '-')} |")
print()
print("| hearth bench | tp | decode tok/s | roofline % (per GPU) | TTFT ms | NVML GiB by rank | path |")
print("|---|---|---|---|---|---|---|")
for r in lines("bench.jsonl"):
    per = r.get("peak_vram_bytes_per_gpu") or [r["peak_vram_bytes"]]
    print(f"| {r['label']} | {r.get('tensor_parallel', 1)} | {r['decode_tokens_per_s']:,.1f} | "
          f"{100 * r['roofline_fraction']:.0f}% | {r['ttft_ms']:.1f} | "
          f"{', '.join('?' if b is None else f'{b / 2**30:.2f}' for b in per)} | {r['decode_path']} |")
ids = {n: [i for e in lines(f"run_tp{n}.jsonl") if e.get("event") == "token" for i in e["token_ids"]]
       for n in (1, 2)}
same = next((k for k, (a, b) in enumerate(zip(ids[1], ids[2])) if a != b),
            min(len(ids[1]), len(ids[2])))
print()
if ids[1] or ids[2]:
    print(f"hearth run, demo model, greedy: tp=1 {len(ids[1])} tokens, tp=2 {len(ids[2])} "
          "tokens, " + ("identical" if ids[1] == ids[2] else f"the same first {same}"))
EOF
