#!/usr/bin/env bash
# One GPU, decode: the int4 products launched as programmatic dependents (HEARTH_PDL).
# Parts: probe (what this torch and Triton offer: gdc, launch_pdl, Inductor's enable_pdl),
# layers (pdl_layers.py: 28 layers of the 7B, AWQ and NF4, one graph, off/products/auto), tests
# (the new test first, then the kernels' and the step's GPU tests), bench (`hearth bench`, 7B
# AWQ, --compile and not, HEARTH_PDL=auto and off in the same call), rows (the tree's rows:
# AWQ, NF4 and bf16, the 8B with an int4 lm_head). Default: probe layers tests.
set -u
source bench/device_env.sh
B=bench
Q=$B/qwen2.5-7b
export LIMIT=${LIMIT:-150}
A="--model $Q --random-weights --prompt-len 512 --new-tokens 256 --no-peer"
for part in ${*:-probe layers tests}; do
case "$part" in
probe)
    python3 - <<'PY' 2>&1 | tee "$OUT/probe.txt"
import torch, triton, torch._inductor.config as c
from triton.backends.nvidia.compiler import CUDAOptions
try:
    from triton.language.extra.cuda import gdc_wait  # noqa: F401
    gdc = True
except ImportError:
    gdc = False
print("gdc", gdc, "launch_pdl", "launch_pdl" in CUDAOptions.__dataclass_fields__,
      "inductor enable_pdl", hasattr(c.triton, "enable_pdl"), "cc", torch.cuda.get_device_capability(),
      "cuda", torch.version.cuda)
PY
    ;;
layers)
    timeout 150 python3 $B/pdl_layers.py 2>&1 | tee "$OUT/layers_awq.txt"
    timeout 150 python3 $B/pdl_layers.py --nf4 2>&1 | tee "$OUT/layers_nf4.txt" ;;
tests)  # carry .whl: bitsandbytes, for the NF4 tests against its layers
    timeout ${TESTS_LIMIT:-400} python3 -m pytest -q -p no:cacheprovider \
        tests/engine/kernels/test_pdl_gpu.py tests/engine/platform/test_nvrtc.py \
        tests/engine/kernels/test_int4_mma_kernel.py tests/engine/quant/test_nf4_linear.py \
        tests/engine/models/test_fused_ops.py tests/engine/kernels/test_decode_attention_kernel.py \
        tests/engine/kernels/test_batched_decode_kernel.py \
        tests/engine/kernels/test_paged_decode_kernel.py tests/engine/models/test_fast_path.py \
        tests/engine/step/test_prefill_graphs_gpu.py tests/engine/quant/test_int4_rows.py \
        tests/engine/generate/test_batch_run_gpu.py tests/engine/models/test_invariant_gpu.py \
        tests/engine/cache/test_quantized_kv.py tests/engine/quant/test_awq.py \
        tests/engine/kernels/test_kv_write_kernel.py \
        2>&1 | tail -25 | tee "$OUT/tests.txt" ;;
bench)
    bench 7b-awq-compile-auto $A --compile --quant awq
    HEARTH_PDL=off bench 7b-awq-compile-off $A --compile --quant awq
    bench 7b-awq-auto $A --quant awq
    HEARTH_PDL=off bench 7b-awq-off $A --quant awq ;;
rows)  # the tree's rows (carry .whl for NF4): AWQ, off, NF4, bf16, the 8B with an int4 lm_head
    bench 7b-awq $A --quant awq
    HEARTH_PDL=off bench 7b-awq-off $A --quant awq
    bench 7b-nf4 $A --quant nf4
    HEARTH_PDL=off bench 7b-nf4-off $A --quant nf4
    bench 7b-bf16 $A --quant bf16
    bench 8b-awq ${A/qwen2.5-7b/llama-3.1-8b} --quant awq --lm-head int4
    bench 7b-awq-again $A --quant awq ;;
*) echo "unknown part $part" >&2; exit 2 ;;
esac
done
