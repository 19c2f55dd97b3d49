# Sourced by the device scripts: the carried wheels (bitsandbytes, the server's) where there are
# any, the environment, $OUT and $LOG, the device and library versions at the top of the log, and
# bench: one `hearth bench` row into $OUT/bench.jsonl.
export PYTHONPATH=$PWD
if ls .whl/*.whl >/dev/null 2>&1; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site:$PWD
fi
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"; LOG="$OUT/log.txt"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee -a "$LOG"
python3 -c "import torch, transformers, triton; print('torch', torch.__version__, 'transformers', transformers.__version__, 'triton', triton.__version__)" | tee -a "$LOG"
bench() {  # label, then hearth bench arguments (LIMIT: seconds, default 120)
    local label=$1; shift
    echo "== $label: hearth bench $*" | tee -a "$LOG"
    if timeout "${LIMIT:-120}" python3 -m engine.cli.cli bench --out /tmp/r.json "$@" >>"$LOG" 2>&1; then
        python3 -c "import json,sys; r=json.load(open('/tmp/r.json')); r['label']=sys.argv[1]; r['args']=sys.argv[2]; print(json.dumps(r))" "$label" "$*" | tee -a "$OUT/bench.jsonl"
    else echo "FAILED $label" | tee -a "$LOG"; tail -5 "$LOG"; fi
}
