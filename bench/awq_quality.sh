#!/usr/bin/env bash
# Perplexity of the bundled demo model by weight format, AWQ included: CPU only, a few
# minutes. AWQ is calibrated on the demo's training split, never on the held-out text it is
# measured on; rtn is the same 4-bit format rounded without AWQ's search. One JSON line per row
# in $WORK/quality.jsonl. Usage (repo root): bash bench/awq_quality.sh [WORK]
set -euo pipefail
WORK=${1:-/tmp/hearth-awq-quality}
PY=${PYTHON:-python3}
TEXT=packaging/demo_model/heldout.txt
hearth() { "$PY" -m engine.cli.cli "$@"; }
rm -rf "$WORK" && mkdir -p "$WORK"
"$PY" - "$WORK/calibration.txt" <<'PYEOF'
import json, lzma, sys
with lzma.open("packaging/demo_model/corpus/train.jsonl.xz", "rt", encoding="utf-8") as f:
    docs = [json.loads(line)["doc"] for line in f]
open(sys.argv[1], "w", encoding="utf-8").write("\n\n".join(docs))
PYEOF
hearth quantize --method awq --out "$WORK/awq" --calibration "$WORK/calibration.txt" --device cpu
hearth quantize --method rtn --out "$WORK/rtn" --device cpu
row() { hearth eval --text "$TEXT" --json "$@" | tee -a "$WORK/quality.jsonl"; }
row --quant bf16
row --quant int8
row --quant nf4
row --model "$WORK/awq"
row --model "$WORK/rtn"
row --quant bf16 --lm-head int8
row --quant bf16 --lm-head int4
row --model "$WORK/awq" --lm-head int8
row --model "$WORK/awq" --lm-head int4
