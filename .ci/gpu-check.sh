#!/usr/bin/env bash
# The GPU path on a machine with an NVIDIA GPU: CuPy workers, staging through host buffers, CUDA-aware
# MPI where the library has it, and the layers against PyTorch. Run from anywhere:
#
#   OUT=/tmp/gpu-check .ci/gpu-check.sh            # every step
#   STEPS="preflight tests" .ci/gpu-check.sh      # some of: preflight install tests train oracle cuda-aware bench
#                                                 #          bench-train ps osdp
#
# Steps (each one's output in $OUT/<step>.log; one line per step in $OUT/summary.txt: ok, FAIL or skip):
#   preflight   nvidia-smi, the interpreter, and which of numpy, mpi4py, cupy, torch import (versions)
#   install     only where nvidia-smi finds a GPU, only what is missing: the gpu and test extras, torch,
#               and MPICH (with pytest-mpi, in a venv over PYTHON's packages) where no mpiexec is found
#   tests       python -m pytest -m gpu -x -q (the suite's CuPy cases), then the fake-device tests
#   train       mpiexec -n 3 ... train --set backend=cupy (two workers sharing the GPU) for every sync
#               model in MODELS (default all six), wait-free backprop on and off, staged through host
#               buffers; then BSP with four workers on the one GPU (mpiexec -n 5)
#   oracle      BSP on CuPy against the single-process NumPy oracle: the models' largest difference
#   cuda-aware  a CuPy array sent between two ranks; if it arrives intact, BSP with
#               runtime.cuda_aware_mpi=true, wait-free backprop on and off (else: skip, and why). Then the
#               same with Intel MPI where .whl/impi-min.tgz is (.ci/impi-bundle.sh; I_MPI_OFFLOAD=1):
#               the probe, and BSP on CuPy with cuda_aware_mpi=true (wait-free backprop off and on) and
#               staged, each against the NumPy oracle, their samples/s side by side
#   bench       python -m ebsp_mpi bench nn --device cuda, BENCH_RUNS times (default 2): CuPy layers against
#               PyTorch on the same GPU
#   bench-train python -m ebsp_mpi bench train --device cuda: BSP training runs on CuPy (the large MLP and the
#               CNN; TRAIN_WORKERS, default "1 4", share the GPU) against PyTorch's own loop on the GPU
#   ps          bench ps --servers 1,2,4 under mpiexec -n PS_RANKS (default 9): the push + pull round
#               trip through 1, 2 and 4 server ranks against raw MPI (CPU ranks; needs the cores)
#   osdp        OSDP's predicted against measured peak memory and iteration time (jobs/osdp/measure.sh,
#               docs/osdp.md): on NumPy, 3 workers and the server with a core each (the GPU machine's
#               CPUs, OSDP_WORKERS to change), then on CuPy with one worker (the device to itself);
#               OSDP_BACKENDS="numpy" runs the first alone
#
# Environment: PYTHON (default: .venv/bin/python where it runs, else python3), MPIEXEC (default: the
# mpiexec beside PYTHON, else on PATH), PIP_INSTALL_ARGS (e.g. "--no-index --find-links /wheels" on an
# offline machine; a .whl/ folder in the repository is then the only source, see below),
# ITERATIONS (per worker, default 200), STEP_TIMEOUT (seconds per command, default 540), PACK=1 (leave
# only summary.txt and gpu-check.tgz, everything else, in $OUT: the lent machine returns at most 8 files).
# On the lent machine (10 minutes a command), carrying .whl: one call of about 5 minutes gives the
# figures of docs/performance.md, "On a GPU" (train and ps take a call of their own):
#   STEPS="preflight install tests cuda-aware bench bench-train osdp" ITERATIONS=100 OSDP_BACKENDS=cupy PACK=1 .ci/gpu-check.sh
#   STEPS="install train" PACK=1 .ci/gpu-check.sh
# The exit status is the number of failed steps (0: all ok or skipped).
#
# On a lent machine that reaches nothing (its image has CuPy, torch, mpi4py, numba, h5py, scikit-learn
# and pytest, but no MPI library), carry MPICH's wheel, fetched here beforehand:
#   python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
#     --platform manylinux_2_28_x86_64 -d .whl mpich pytest-mpi
#
# A rehearsal on a CPU, with the tests' fake CuPy in place of the real one (it proves the script, not the GPU):
#   PYTHONPATH=$PWD/tests/fakecupy_path ITERATIONS=20 OUT=/tmp/gpu-dry STEPS="tests train oracle cuda-aware" .ci/gpu-check.sh
set -uo pipefail
cd "$(dirname "$0")/.." || exit 2

OUT=${OUT:-$PWD/gpu-check-out}
STEPS=${STEPS:-preflight install tests train oracle cuda-aware bench bench-train osdp}
ITERATIONS=${ITERATIONS:-200}
STEP_TIMEOUT=${STEP_TIMEOUT:-540}
mkdir -p "$OUT"
: >"$OUT/summary.txt"
failures=0

if [[ -z ${PYTHON:-} ]]; then
  if .venv/bin/python -c "" 2>/dev/null; then PYTHON=$PWD/.venv/bin/python; else PYTHON=$(command -v python3); fi
fi
if [[ -z ${MPIEXEC:-} ]]; then
  if [[ -x $(dirname "$PYTHON")/mpiexec ]]; then MPIEXEC=$(dirname "$PYTHON")/mpiexec; else MPIEXEC=$(command -v mpiexec || echo mpiexec); fi
fi
# Open MPI refuses to start as root without these (containers); MPICH ignores them
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export PYTHONUNBUFFERED=1
# the package from this checkout wherever a step runs (jobs/osdp/measure.sh works in its own folder), also
# where the image's packages satisfy the extras and nothing is installed
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}

wanted() { [[ " $STEPS " == *" $1 "* ]]; }

record() {  # record NAME STATUS SECONDS [NOTE]
  printf '%-34s %-12s %5ss  %s\n' "$1" "$2" "$3" "${4:-}" | tee -a "$OUT/summary.txt"
}

run() {  # run NAME CMD...: one command, its output in $OUT/NAME.log, its status in the summary
  local name=$1 t0=$SECONDS status=ok rc
  shift
  timeout "$STEP_TIMEOUT" "$@" >"$OUT/$name.log" 2>&1
  rc=$?
  if ((rc != 0)); then
    status="FAIL(rc=$rc)"
    failures=$((failures + 1))
  fi
  record "$name" "$status" $((SECONDS - t0)) "$(tail -n 1 "$OUT/$name.log" | cut -c1-110)"
}

imports() { "$PYTHON" -c "import $1" 2>/dev/null; }

train() {  # train NAME OVERRIDE...: mpiexec -n 3 ... train on CuPy into $OUT/runs/NAME
  local name=$1
  shift
  run "$name" "$MPIEXEC" -n 3 "$PYTHON" -m ebsp_mpi train -q --out "$OUT/runs/$name" --set backend=cupy \
    --set stop.iterations="$ITERATIONS" --set stop.epochs=0 "$@"
}

if wanted preflight; then
  {
    nvidia-smi || echo "nvidia-smi: not found or failed"
    echo "PYTHON=$PYTHON ($("$PYTHON" --version 2>&1))  MPIEXEC=$MPIEXEC"
    "$MPIEXEC" --version 2>&1 | head -n 3
    for m in numpy mpi4py numba h5py cupy torch ebsp_mpi; do
      "$PYTHON" -c "import $m; print('$m', getattr($m, '__version__', '?'))" 2>&1 | tail -n 1
    done
    "$PYTHON" -c "import cupy; print('CUDA devices:', cupy.cuda.runtime.getDeviceCount(), \
      'runtime', cupy.cuda.runtime.runtimeGetVersion(), 'driver', cupy.cuda.runtime.driverGetVersion())" 2>&1 | tail -n 1
  } >"$OUT/preflight.log" 2>&1
  record preflight ok 0 "see preflight.log"
fi

if wanted install && ! nvidia-smi >/dev/null 2>&1; then
  record install skip 0 "no GPU here (nvidia-smi fails): nothing installed"
elif wanted install; then
  # The device image may hold CuPy and torch already (a CUDA 13 image has cupy-cuda13x where the gpu
  # extra names cupy-cuda12x): install only what is missing. Wheels in .whl/ (carried to an offline
  # machine) are the only source when that folder exists.
  pip_args=()
  [[ -d .whl ]] && pip_args=(--no-index --find-links "$PWD/.whl")
  # shellcheck disable=SC2206  # PIP_INSTALL_ARGS is a list of words on purpose
  pip_args+=(${PIP_INSTALL_ARGS:-})
  if imports "cupy, mpi4py, numba, h5py, sklearn, pytest"; then
    record install-gpu-extra skip 0 "cupy, mpi4py, numba, h5py, sklearn and pytest import already"
  else
    run install-gpu-extra "$PYTHON" -m pip install "${pip_args[@]}" -e ".[gpu,test]"
  fi
  if imports torch; then
    record install-torch skip 0 "torch imports already"
  else
    run install-torch "$PYTHON" -m pip install "${pip_args[@]}" torch
  fi
  venv=/tmp/ebsp-gpu-venv  # kept while the machine stays warm: a later call finds it
  if [[ -x $venv/bin/mpiexec ]]; then
    record install-mpi skip 0 "$venv from an earlier call"
  elif [[ -x $MPIEXEC ]] || command -v "$MPIEXEC" >/dev/null; then
    record install-mpi skip 0 "$MPIEXEC is there"
    venv=
  else  # MPICH's wheel in a venv that sees the image's packages: mpiexec, and libmpi for mpi4py
    run install-mpi bash -c "'$PYTHON' -m venv --system-site-packages $venv && \
      $venv/bin/python -m pip install ${pip_args[*]} mpich pytest-mpi"
  fi
  if [[ -n $venv ]]; then
    PYTHON=$venv/bin/python MPIEXEC=$venv/bin/mpiexec
    export LD_LIBRARY_PATH=$venv/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
  fi
fi

if wanted tests; then
  run pytest-gpu "$PYTHON" -m pytest -m gpu -x -q -p no:cacheprovider
  # the fake-device tests too: they must pass where the real CuPy is installed
  run pytest-gpu-paths "$PYTHON" -m pytest -x -q -p no:cacheprovider tests/test_gpu_paths.py \
    tests/test_backend_env.py tests/test_nn_backends.py
fi

if wanted train; then
  for model in ${MODELS:-bsp asp ssp dssp elasticbsp psp}; do
    for wfbp in false true; do
      train "train-$model-wfbp-$wfbp" --set sync.model="$model" --set runtime.wait_free_backprop="$wfbp"
    done
  done
  run train-bsp-4-workers "$MPIEXEC" -n 5 "$PYTHON" -m ebsp_mpi train -q --out "$OUT/runs/train-bsp-4-workers" \
    --set backend=cupy --set sync.model=bsp --set stop.iterations="$ITERATIONS" --set stop.epochs=0
fi

if wanted oracle; then
  oracle=(--set sync.model=bsp --set stop.iterations=40 --set stop.epochs=0 --set optim.momentum=0.9
          --set straggler.enabled=false)
  run oracle-numpy "$PYTHON" -m ebsp_mpi train -q --out "$OUT/runs/oracle-numpy" --set backend=numpy \
    --set sync.workers=2 "${oracle[@]}"
  for wfbp in false true; do
    run "oracle-cupy-wfbp-$wfbp" "$MPIEXEC" -n 3 "$PYTHON" -m ebsp_mpi train -q --out "$OUT/runs/oracle-cupy-wfbp-$wfbp" \
      --set backend=cupy --set runtime.wait_free_backprop="$wfbp" "${oracle[@]}"
    # the tests' comparison (the same tensors and version, tests/mpirun.py); 1e-4, not the tests' 1e-5:
    # those compare NumPy with NumPy, here cuBLAS sums 40 iterations of float32 in another order
    run "oracle-compare-wfbp-$wfbp" env PYTHONPATH="$PWD/tests${PYTHONPATH:+:$PYTHONPATH}" "$PYTHON" -c '
import sys
from pathlib import Path

from mpirun import max_abs_difference

diff = max_abs_difference(Path(sys.argv[1]), Path(sys.argv[2]))
print(f"BSP on CuPy against the NumPy oracle: largest difference {diff:.3g} (tolerance 1e-4)")
sys.exit(0 if diff <= 1e-4 else 1)
' "$OUT/runs/oracle-numpy" "$OUT/runs/oracle-cupy-wfbp-$wfbp"
  done
fi

if wanted cuda-aware; then
  probe=$OUT/cuda-aware-probe.py
  cat >"$probe" <<'EOF'
# Two ranks: rank 0 sends a CuPy array straight from device memory; a CUDA-aware MPI delivers it intact,
# one that is not reads a device pointer as host memory (garbage, or a crash).
import cupy
from mpi4py import MPI

comm = MPI.COMM_WORLD
a = cupy.arange(1 << 20, dtype=cupy.float32) if comm.rank == 0 else cupy.zeros(1 << 20, dtype=cupy.float32)
cupy.cuda.get_current_stream().synchronize()
if comm.rank == 0:
    comm.Send([a, MPI.FLOAT], dest=1)
else:
    comm.Recv([a, MPI.FLOAT], source=0)
    ok = bool((a == cupy.arange(1 << 20, dtype=cupy.float32)).all())
    print("CUDA-aware MPI:", "yes" if ok else "no (wrong values)")
    raise SystemExit(0 if ok else 1)
EOF
  t0=$SECONDS
  if timeout 120 "$MPIEXEC" -n 2 "$PYTHON" "$probe" >"$OUT/cuda-aware-probe.log" 2>&1; then
    record cuda-aware-probe ok $((SECONDS - t0)) "$(tail -n 1 "$OUT/cuda-aware-probe.log")"
    for wfbp in false true; do
      train "train-bsp-cuda-aware-wfbp-$wfbp" --set sync.model=bsp --set runtime.cuda_aware_mpi=true \
        --set runtime.wait_free_backprop="$wfbp"
    done
  else
    record cuda-aware-probe skip $((SECONDS - t0)) "this MPI is not CUDA-aware (see cuda-aware-probe.log)"
  fi
  if [[ -f .whl/impi-min.tgz ]]; then  # Intel MPI's GPU buffers: a CUDA-aware MPI from PyPI
    rm -rf /tmp/impi && tar xzf .whl/impi-min.tgz -C /tmp
    # Intel MPI opens libcuda.so, which a container may have only as libcuda.so.1: the driver CUDA loaded
    cudalib=$("$PYTHON" -c "import cupy; cupy.cuda.runtime.getDeviceCount()
print(next((l.split()[-1] for l in open('/proc/self/maps') if 'libcuda.so' in l), ''))" 2>/dev/null)
    # IMPI_OFFLOAD=0 rehearses the steps on the fake device (tests/fakecupy.py), where no driver is
    impi=(env I_MPI_ROOT=/tmp/impi LD_LIBRARY_PATH=/tmp/impi/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
          FI_PROVIDER_PATH=/tmp/impi/lib/libfabric MPI4PY_LIBMPI=/tmp/impi/lib/libmpi.so.12
          I_MPI_OFFLOAD="${IMPI_OFFLOAD:-1}" I_MPI_OFFLOAD_MODE=cuda ${cudalib:+I_MPI_OFFLOAD_CUDA_LIBRARY=$cudalib}
          I_MPI_FABRICS=shm /tmp/impi/bin/mpiexec)
    echo "Intel MPI: libcuda at ${cudalib:-(not found)}" >"$OUT/impi-env.log"
    t0=$SECONDS
    if timeout 120 "${impi[@]}" -n 2 "$PYTHON" "$probe" >"$OUT/impi-probe.log" 2>&1; then
      record impi-probe ok $((SECONDS - t0)) "Intel MPI: $(tail -n 1 "$OUT/impi-probe.log")"
      ca=(-q --set backend=cupy --set sync.model=bsp --set stop.iterations=40 --set stop.epochs=0
          --set optim.momentum=0.9 --set straggler.enabled=false)
      [[ -f $OUT/runs/oracle-numpy/summary.json ]] || run oracle-numpy "$PYTHON" -m ebsp_mpi train -q \
        --out "$OUT/runs/oracle-numpy" --set backend=numpy --set sync.workers=2 "${ca[@]:3}"
      for wire in "cuda_aware_mpi=true wait_free_backprop=false" "cuda_aware_mpi=true wait_free_backprop=true" \
                  "cuda_aware_mpi=false wait_free_backprop=false"; do
        name=impi-$(echo "$wire" | tr ' =' '--' | sed 's/cuda_aware_mpi/ca/; s/wait_free_backprop/wfbp/')
        read -r a b <<<"$wire"
        run "$name" "${impi[@]}" -n 3 "$PYTHON" -m ebsp_mpi train --out "$OUT/runs/$name" "${ca[@]}" \
          --set "runtime.$a" --set "runtime.$b"
        run "$name-oracle" env PYTHONPATH="$PWD/tests${PYTHONPATH:+:$PYTHONPATH}" "$PYTHON" -c '
import json, sys
from pathlib import Path

from mpirun import max_abs_difference

diff = max_abs_difference(Path(sys.argv[1]), Path(sys.argv[2]))
s = json.loads(Path(sys.argv[2], "summary.json").read_text())
rate, wall = s["samples_per_second"], s["wall_seconds"]
print(f"{Path(sys.argv[2]).name}: against the NumPy oracle {diff:.3g} (tolerance 1e-4), "
      f"{rate:.0f} samples/s, {wall:.2f} s")
sys.exit(0 if diff <= 1e-4 else 1)
' "$OUT/runs/oracle-numpy" "$OUT/runs/$name"
      done
      # the bandwidth-bound MLP of bench train (1.07 M parameters), device buffers against staged
      large=(--set data.name=synthetic --set data.synthetic_features=784 --set data.synthetic_samples=10000
             --set model.hidden=[1024,256] --set data.batch_size=64 --set stop.iterations=300 --set stop.epochs=0
             --set straggler.enabled=false --set eval.every_seconds=1e9 --set backend=cupy)
      for ca in true false; do
        run "impi-large-ca-$ca" "${impi[@]}" -n 3 "$PYTHON" -m ebsp_mpi train -q --out "$OUT/runs/impi-large-ca-$ca" \
          "${large[@]}" --set runtime.cuda_aware_mpi=$ca
        "$PYTHON" -c "import json, sys; s = json.load(open(sys.argv[1])); print(f'large MLP, 2 workers, cuda_aware_mpi=$ca: \
{s[\"samples_per_second\"]:.0f} samples/s')" "$OUT/runs/impi-large-ca-$ca/summary.json" 2>&1 | tee -a "$OUT/summary.txt"
      done
    else
      record impi-probe FAIL $((SECONDS - t0)) "Intel MPI did not deliver a device buffer (see impi-probe.log)"
      failures=$((failures + 1))
    fi
  fi
fi

if wanted bench; then
  if imports torch; then
    for k in $(seq "${BENCH_RUNS:-2}"); do  # layers of a few hundred microseconds: one run is not a figure
      run "bench-nn-$k" "$PYTHON" -m ebsp_mpi bench --json "$OUT/bench-nn-$k.json" nn --device cuda
    done
  else
    record bench-nn skip 0 "torch does not import"
  fi
fi

if wanted bench-train; then
  for w in ${TRAIN_WORKERS:-1 4}; do
    run "bench-train-$w" "$PYTHON" -m ebsp_mpi bench --json "$OUT/bench-train-$w.json" train --device cuda \
      --mpiexec "$MPIEXEC" --sizes large,cnn --models bsp --workers "$w" --reps "${TRAIN_REPS:-2}" \
      --set stop.iterations="${TRAIN_ITERATIONS:-300}"
  done
fi

if wanted ps; then
  run bench-ps "$MPIEXEC" -n "${PS_RANKS:-9}" "$PYTHON" -m ebsp_mpi bench --json "$OUT/bench-ps.json" ps \
    --servers 1,2,4 ${PS_ARGS:-}
fi

if wanted osdp; then  # each prints its table; its runs stay in /tmp (the lent machine returns few files)
  for backend in ${OSDP_BACKENDS:-numpy cupy}; do
    workers=${OSDP_WORKERS:-3}
    [[ $backend == cupy ]] && workers=1
    run "osdp-$backend" env PYTHON="$PYTHON" MPIEXEC="$MPIEXEC" BACKEND=$backend WORKERS="$workers" \
      OUT="/tmp/osdp-$backend" IT="$ITERATIONS" bash jobs/osdp/measure.sh
  done
fi

echo "$failures failed step(s); logs in $OUT" | tee -a "$OUT/summary.txt"
if [[ ${PACK:-0} == 1 ]]; then  # the lent machine returns few files: one archive beside the summary
  tar czf /tmp/gpu-check.tgz -C "$OUT" --exclude=./summary.txt . &&
    find "$OUT" -mindepth 1 ! -name summary.txt -delete && mv /tmp/gpu-check.tgz "$OUT/"
fi
exit "$failures"
