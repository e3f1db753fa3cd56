#!/bin/bash
# OSDP on the wide MLP, 3 workers: predicted against measured peak memory and iteration time per limit.
#   bash jobs/osdp/measure.sh            (OUT=/tmp/osdp, LIMITS="28MiB 24MiB ... 4MiB", IT=100 iterations,
#                                         WORKERS=3; WORKERS=1 on 2 cores gives each rank a core;
#                                         BACKEND=cupy: profile, plan and train on the GPU)
# 1. bench mpi and profile; 2. an all-resident run calibrates the overhead per iteration, what it shows
# beyond its prediction (docs/osdp.md); 3. per limit: plan with it, train, and print one table row.
set -e
OUT=${OUT:-/tmp/osdp}; JOB=$(cd "$(dirname "$0")" && pwd)/wide-mlp.toml; mkdir -p "$OUT"; cd "$OUT"
export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 MKL_NUM_THREADS=1
P=${PYTHON:-python}; M=${MPIEXEC:-mpiexec}
IT=${IT:-100}; WORKERS=${WORKERS:-3}; B="--set backend=${BACKEND:-numpy}"
# no evaluation during training: on this model one takes the server some 0.1 s of a core a second
E="--set eval.every_seconds=1e9"
$M -n 2 $P -m ebsp_mpi bench mpi --json mpi.json >/dev/null
$P -m ebsp_mpi profile "$JOB" $B --reps 20 --bench mpi.json --out wide.json -q >/dev/null
run() {  # run plan file $1 into dir $2 (its errors in $2.err)
  rm -rf $2; $M -n $((WORKERS + 1)) $P -m ebsp_mpi train "$JOB" $B $E --set osdp.plan=$1 --set stop.iterations=$IT --out $2 -q >/dev/null 2>$2.err
}
$P -m ebsp_mpi plan "$JOB" $B --profile wide.json --memory-limit 64MiB --out cR.json -q >/dev/null
run cR.json r_R
O=$($P -c "
import json,numpy as np; s=json.load(open('r_R/summary.json'))['osdp']; p=json.load(open('cR.json'))['predicted']
print(float(np.median(s['measured']['iteration_s']))-p['iteration_s'])")
echo "calibrated: overhead $O s per iteration"
for lim in ${LIMITS:-28MiB 24MiB 20MiB 16MiB 12MiB 8MiB 6MiB 4MiB}; do
  $P -m ebsp_mpi plan "$JOB" $B --profile wide.json --memory-limit $lim --overhead $O --out p_$lim.json -q >/dev/null
  # a run that fails (on CuPy: arrays past the plan's bound) is a row saying so; the others go on
  run p_$lim.json r_$lim || { echo "| $lim | failed: $(grep -m1 'ebsp_mpi' r_$lim.err || tail -n1 r_$lim.err) |"; continue; }
  $P - $lim <<'PY'
import json, sys, numpy as np
lim=sys.argv[1]; s=json.load(open(f'r_{lim}/summary.json')); o=s['osdp']; p=json.load(open(f'p_{lim}.json'))
ch=", ".join('R' if l['mode']=='resident' else ('D' if l['slices']==1 else f"S{l['slices']}") for l in p['layers'])
pp, pi = o['predicted']['peak_bytes'], o['predicted']['iteration_s']
mp, mi = np.median(o['measured']['peak_bytes']), np.median(o['measured']['iteration_s'])
live = [v for v in o['measured'].get('live_peak_bytes', []) if v is not None]  # CuPy: the arrays alone
arrays = f" (arrays {np.median(live)/2**20:.2f})" if live else ""
print(f"| {lim} | {ch} | {pp/2**20:.2f} MiB | {mp/2**20:.2f} MiB{arrays} | {100*(mp/pp-1):+.1f} % | {pi*1e3:.1f} ms | {mi*1e3:.1f} ms | {100*(mi/pi-1):+.1f} % | {64/mi:.0f} |")
PY
done
