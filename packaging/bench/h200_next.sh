#!/usr/bin/env bash
# The H200 runs still owed, in order of what they unblock, each under its own limit so that one
# call of at most 10 minutes returns what ran (results under $OUT, one folder per part):
#   bash packaging/bench/h200_next.sh serve      issue 26's figures (batching.sh serve)       ~6 min
#   bash packaging/bench/h200_next.sh tests      the GPU tests of the batch (batching.sh tests) ~5 min
#   bash packaging/bench/h200_next.sh batching   bf16 at 1, 4, 16, 64 again (batching.sh bf16) ~9 min
#   bash packaging/bench/h200_next.sh awq        the int4 GEMM's GPU tests, the 24 GiB memory run,
#                                                AWQ at 1, 4, 16, 64 (batching.sh)              ~7 min
#   bash packaging/bench/h200_next.sh gemm       int4_gemm.sh: the GEMM's tests, sweep, TTFT   ~9 min
#   bash packaging/bench/h200_next.sh peer       peer_int4.sh: gpt-fast against hearth bench   ~8 min
#   bash packaging/bench/h200_next.sh both       serve, then bf16 at 64 beside batch 1 (no peer) ~8 min
#   bash packaging/bench/h200_next.sh batch1     issue 25's "batch 1 within 3% of 7c5b653 in the
#                                                same call" (layers_compare.sh, 7B bf16 and AWQ);
#                                                first: mkdir old-7c5b653 && git archive 7c5b653
#                                                engine pyproject.toml | tar -x -C old-7c5b653,
#                                                and carry it                             ~5 min
#   bash packaging/bench/h200_next.sh owed20     session 20's GPU tests not run there: the
#                                                reproducible mode and the batch on the gemv ~4 min
#   bash packaging/bench/h200_next.sh gemv21     session 21's gemv (x in two 16-byte loads a
#                                                k-group ahead, NF4's code from registers): the
#                                                int4 and NF4 GPU tests, the sweep at 1 and 4 rows
#                                                (7B AWQ, NF4; 8B AWQ), then peer_int4.sh's
#                                                gpt-fast int4 and 8B/7B AWQ, 7B NF4      ~9 min
#   bash packaging/bench/h200_next.sh check21     the int4 and NF4 GPU tests, owed20's, and NF4's
#                                                shared-table share swept (--lut)          ~7 min
#   bash packaging/bench/h200_next.sh owed21      what session 21 could not run: the demo model's
#                                                perplexity through the new kernels (nf4.sh ppl:
#                                                NF4 and an AWQ copy against bitsandbytes and
#                                                tinygemm), the int4 and NF4 GPU tests again ~4 min
#   bash packaging/bench/h200_next.sh owed23      what session 23 changed after its last GPU
#                                                tests: the int4 products at the 8B's and the
#                                                int4 lm_heads' shapes, the GLU choice through
#                                                Int4Linear.choose_glu, PrefillGraphs.of, the
#                                                fused pieces and the batch (decode_fusion.sh
#                                                tests), then its bench rows           ~9 min
# Carry [".whl"] (serve: the server's wheels; awq/peer: bitsandbytes) and for peer [".peers"] too;
# the 64 MiB carry limit holds the server wheels or bitsandbytes beside the tree, not both.
set -u
B=packaging/bench
part=${1:?serve, tests, batching, awq, gemm, peer, both, batch1, owed20, gemv21, check21, owed21 or owed23}
export OUT=${OUT:-/tmp/out}/$part
mkdir -p "$OUT"
case "$part" in
serve) bash $B/batching.sh serve ;;
tests) bash $B/batching.sh tests ;;
batching) bash $B/batching.sh bf16 ;;
awq)
    source $B/device_env.sh
    timeout 150 python3 -m pytest -q -p no:cacheprovider tests/engine/kernels/test_int4_gemm_kernel.py \
        tests/engine/quant/test_awq.py -k "gpu or graph" 2>&1 | tail -15 | tee "$OUT/gemm_tests.txt"
    bash $B/batching.sh memory
    bash $B/batching.sh awq ;;
gemm) bash $B/int4_gemm.sh ;;
peer) bash $B/peer_int4.sh ;;
both)
    bash $B/batching.sh serve
    LIMIT=200 bash $B/batching.sh sweep64 ;;
owed20)
    source $B/device_env.sh
    timeout 300 python3 -m pytest -q -p no:cacheprovider tests/engine/models/test_invariant_gpu.py \
        tests/engine/generate/test_batch_run_gpu.py 2>&1 | tail -15 | tee "$OUT/tests.txt" ;;
gemv21)
    source $B/device_env.sh
    timeout 150 python3 -m pytest -q -p no:cacheprovider tests/engine/kernels/test_int4_mma_kernel.py \
        tests/engine/quant/test_nf4_linear.py tests/engine/quant/test_awq.py \
        tests/engine/quant/test_int4_rows.py 2>&1 | tail -15 | tee "$OUT/tests.txt"
    for args in "" "--nf4" "--model llama-3.1-8b"; do
        echo "== int4_gemv.py --rows 1 4 --xpre $args" | tee -a "$OUT/gemv_table.md"
        timeout 100 python3 $B/int4_gemv.py --rows 1 4 --xpre $args --out "$OUT/gemv.jsonl" \
            2>>"$OUT/sweep_err.txt" | grep -v tinygemm | tee -a "$OUT/gemv_table.md"
    done
    DEADLINE=${DEADLINE:-500} bash $B/peer_int4.sh peer-int4 8b-awq 7b-awq 7b-nf4 ;;
check21)
    source $B/device_env.sh
    timeout 130 python3 -m pytest -q -p no:cacheprovider tests/engine/kernels/test_int4_mma_kernel.py \
        tests/engine/quant/test_nf4_linear.py tests/engine/quant/test_awq.py \
        tests/engine/quant/test_int4_rows.py 2>&1 | tail -15 | tee "$OUT/tests.txt"
    timeout 60 python3 $B/int4_gemv.py --rows 1 4 --lut --nf4 --out "$OUT/gemv.jsonl" \
        2>>"$OUT/sweep_err.txt" | tee -a "$OUT/gemv_table.md"
    timeout 220 python3 -m pytest -q -p no:cacheprovider tests/engine/models/test_invariant_gpu.py \
        tests/engine/generate/test_batch_run_gpu.py 2>&1 | tail -15 | tee "$OUT/owed20.txt" ;;
owed21)
    OUT=$OUT bash $B/nf4.sh ppl tests ;;
owed23)
    OUT=$OUT TESTS_LIMIT=330 bash $B/decode_fusion.sh tests bench ;;
batch1) ROWS="7b-bf16 7b-awq" bash $B/layers_compare.sh old=old-7c5b653=engine.cli \
    new=.=engine.serve.cli ;;
*) echo "unknown part $part" >&2; exit 2 ;;
esac
