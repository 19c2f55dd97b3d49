#!/usr/bin/env bash
# CPU: `hearth run` under OpenMP wait settings, each variant set before torch loads
# (docs/benchmark-log.md). Usage: thread_spin.sh ROUNDS NEW_TOKENS LABEL VARIANT...  (shipped: the policy as it
# is; today: libgomp's default spin, 2 threads, no thread governor, the build before the policy;
# onethread: OMP_NUM_THREADS=1; passive: OMP_WAIT_POLICY=PASSIVE, no governor; a number: that
# GOMP_SPINCOUNT, no governor); prints one line per run: decode tokens/s, whole-process wall, load
cd "$(dirname "$0")/.."
rounds=$1; new=$2; label=$3; shift 3
for r in $(seq "$rounds"); do
  for v in "$@"; do
    start=$(date +%s.%N)
    out=$(timeout 300 ${PYTHON:-.venv/bin/python} -c "
import os, sys
import engine  # applies the policy: a short GOMP_SPINCOUNT unless set
from engine.platform import cpu_threads
v = sys.argv[1]
if v != 'shipped':  # the variables before torch loads; no thread governor
    os.environ.pop('GOMP_SPINCOUNT', None)
    cpu_threads.governor_for = lambda device: None
if v == 'onethread':  # the build before the policy, with one thread
    os.environ['OMP_NUM_THREADS'] = '1'
elif v == 'passive':
    os.environ['OMP_WAIT_POLICY'] = 'PASSIVE'
elif v != 'today' and v != 'shipped':
    os.environ['GOMP_SPINCOUNT'] = v
from engine.cli.cli import main
sys.exit(main(sys.argv[2:]))
" "$v" run --raw --prompt The --max-new-tokens "$new" --temperature 0 2>&1 >/dev/null | grep -o "[0-9.]* tokens/s" | tail -1)
    end=$(date +%s.%N)
    echo "$label round=$r variant=$v $out wall=$(echo "$end - $start" | bc) load=$(cut -d' ' -f1 /proc/loadavg)"
  done
done
