#!/usr/bin/env bash
# CPU: `hearth run` under OpenMP wait settings, each variant set before torch loads (BENCHMARKS.md,
# issue 30). Usage: thread_spin.sh ROUNDS NEW_TOKENS LABEL VARIANT...  (passive | onethread | a
# GOMP_SPINCOUNT); prints one line per run: decode tokens/s, whole-process wall, load average
cd "$(dirname "$0")/../.."
rounds=$1; new=$2; label=$3; shift 3
for r in $(seq "$rounds"); do
  for v in "$@"; do
    start=$(date +%s.%N)
    out=$(timeout 300 ${PYTHON:-.venv/bin/python} -c "
import os, sys
import engine  # applies the policy: OMP_WAIT_POLICY=PASSIVE unless set
v = sys.argv[1]
if v == 'onethread':  # today's build before the policy, with one thread
    os.environ.pop('OMP_WAIT_POLICY', None)
    os.environ['OMP_NUM_THREADS'] = '1'
elif v != 'passive':
    os.environ.pop('OMP_WAIT_POLICY', None)
    os.environ['GOMP_SPINCOUNT'] = v
from engine.serve.cli import main
sys.exit(main(sys.argv[2:]))
" "$v" run --raw --prompt The --max-new-tokens "$new" --temperature 0 2>&1 >/dev/null | grep -o "[0-9.]* tokens/s" | tail -1)
    end=$(date +%s.%N)
    echo "$label round=$r variant=$v $out wall=$(echo "$end - $start" | bc) load=$(cut -d' ' -f1 /proc/loadavg)"
  done
done
