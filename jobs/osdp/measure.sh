#!/bin/bash
# OSDP on the wide MLP, 3 workers: predicted against measured peak memory and iteration time per limit.
#   bash jobs/osdp/measure.sh            (OUT=/tmp/osdp, LIMITS="28MiB 24MiB ... 4MiB", IT=100 iterations,
#                                         WORKERS=3; WORKERS=1 on 2 cores gives each rank a core)
# 1. bench mpi and profile; 2. an all-resident run and a run under 20 MiB calibrate the overhead per
# iteration and the latency per fetch message as the runs see them (docs/osdp.md); 3. per limit: plan
# with those, train, and print one table row.
set -e
OUT=${OUT:-/tmp/osdp}; JOB=$(cd "$(dirname "$0")" && pwd)/wide-mlp.toml; mkdir -p "$OUT"; cd "$OUT"
export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 MKL_NUM_THREADS=1
P=${PYTHON:-python}; M=${MPIEXEC:-mpiexec}
IT=${IT:-100}; export WORKERS=${WORKERS:-3}
$M -n 2 $P -m ebsp_mpi bench mpi --json mpi.json >/dev/null
$P -m ebsp_mpi profile "$JOB" --reps 20 --bench mpi.json --out wide.json -q >/dev/null
run() {  # run plan file $1 into dir $2
  rm -rf $2; $M -n $((WORKERS + 1)) $P -m ebsp_mpi train "$JOB" --set osdp.plan=$1 --set stop.iterations=$IT --out $2 -q >/dev/null
}
$P -m ebsp_mpi plan "$JOB" --profile wide.json --memory-limit 64MiB --out cR.json -q >/dev/null
$P -m ebsp_mpi plan "$JOB" --profile wide.json --memory-limit 20MiB --out c20.json -q >/dev/null
run cR.json r_R; run c20.json r_20
L=$($P - <<'PY'
import json, os, numpy as np
s=json.load(open('r_20/summary.json')); o=s['osdp']['measured']; it=np.mean(s['iterations'])
bw=json.load(open('wide.json'))['network']['bandwidth_bytes_per_s']
plan=json.load(open('c20.json')); od=sum(l['params']*4 for l in plan['layers'] if l['mode']=='on-demand')
fetched=np.mean([s['bytes'][r]['total']['fetch']['received'] for r in range(1, int(os.environ['WORKERS']) + 1)])/it
L=(np.mean(o['transfer_wait_s'])-(fetched+od)/bw)/np.mean(o['transfer_messages'])
print(L)
PY
)
$P -m ebsp_mpi plan "$JOB" --profile wide.json --memory-limit 64MiB --latency $L --out cR2.json -q >/dev/null
O=$($P -c "
import json,numpy as np; s=json.load(open('r_R/summary.json'))['osdp']; p=json.load(open('cR2.json'))['predicted']
print(float(np.median(s['measured']['iteration_s']))-p['iteration_s'])")
echo "calibrated: latency $L s per message, overhead $O s per iteration"
for lim in ${LIMITS:-28MiB 24MiB 20MiB 16MiB 12MiB 8MiB 6MiB 4MiB}; do
  $P -m ebsp_mpi plan "$JOB" --profile wide.json --memory-limit $lim --latency $L --overhead $O --out p_$lim.json -q >/dev/null
  run p_$lim.json r_$lim
  $P - $lim <<'PY'
import json, sys, numpy as np
lim=sys.argv[1]; s=json.load(open(f'r_{lim}/summary.json')); o=s['osdp']; p=json.load(open(f'p_{lim}.json'))
ch=", ".join('R' if l['mode']=='resident' else ('D' if l['slices']==1 else f"S{l['slices']}") for l in p['layers'])
pp, pi = o['predicted']['peak_bytes'], o['predicted']['iteration_s']
mp, mi = np.median(o['measured']['peak_bytes']), np.median(o['measured']['iteration_s'])
print(f"| {lim} | {ch} | {pp/2**20:.2f} MiB | {mp/2**20:.2f} MiB | {100*(mp/pp-1):+.1f} % | {pi*1e3:.1f} ms | {mi*1e3:.1f} ms | {100*(mi/pi-1):+.1f} % | {64/mi:.0f} |")
PY
done
