"""Checkpoints and ``train --resume DIR``: what a checkpoint holds, which jobs may resume, and runs that
are killed (kill -9) or stopped (SIGTERM) mid-way and resumed, against the same runs unbroken."""

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import h5py
import numpy as np
import pytest

from ebsp_mpi.checkpoint import (CHECKPOINT_FILE, LAST_LOSS, PENDING_FILE, TOTALS, Checkpoint, commit_checkpoint,
                                 read_checkpoint, resume_job, write_checkpoint)
from ebsp_mpi.config import SyncConfig, load_job, to_dict
from ebsp_mpi.errors import UsageError
from ebsp_mpi.outputs import read_model
from ebsp_mpi.sync.registry import POLICIES, make_policy
from ebsp_mpi.trace import read_run
from mpirun import child_env, local, pids_of_rank, resume, train, train_cmd

# 200 BSP rounds of about 25 ms (an emulated 20 ms of compute): a run of about 5 s to stop in the middle
BSP = ["stop.iterations=200", "straggler.base_s=0.02", "optim.weight_decay=5e-4", "trace.flush_seconds=0.1"]
EVERY = 0.3  # checkpoint.every_seconds


def checkpoint_of(job_overrides=(), workers=2, version=7) -> Checkpoint:
    job = load_job(None, list(job_overrides))
    return Checkpoint(params=np.arange(5, dtype=np.float32), velocity=np.ones(5, np.float32), version=version,
                      run_seconds=1.5, iterations=np.array([7, 6][:workers]),
                      totals={**{name: np.full(workers, 0.25) for name in TOTALS}, LAST_LOSS: np.full(workers, 0.5)},
                      rejected=1, policy={"name": "bsp", "done": [7, 6][:workers], "barriers": 6},
                      evals=[(1.0, 5, 0.3, 0.9)], reached={0.9: 1.0}, config=to_dict(job))


# -- the file ----------------------------------------------------------------------------------------


def test_a_checkpoint_reads_back_what_was_written(tmp_path):
    ckpt = checkpoint_of()
    write_checkpoint(tmp_path, ckpt)
    back = read_checkpoint(tmp_path)
    assert np.array_equal(back.params, ckpt.params) and np.array_equal(back.velocity, ckpt.velocity)
    assert (back.version, back.run_seconds, back.rejected) == (7, 1.5, 1)
    assert back.iterations.tolist() == [7, 6] and back.totals[LAST_LOSS].tolist() == [0.5, 0.5]
    assert back.policy == ckpt.policy and back.evals == [(1.0, 5, 0.3, 0.9)] and back.reached == {0.9: 1.0}
    assert back.config == ckpt.config
    assert not list(tmp_path.glob("*.tmp"))
    quick = read_checkpoint(tmp_path, arrays=False)
    assert quick.params.size == 0 and quick.iterations.tolist() == [7, 6]


@pytest.mark.parametrize("damage, message", [
    (None, "no checkpoint.h5"),
    (b"not hdf5", "not a readable checkpoint"),
])
def test_a_missing_or_broken_checkpoint_is_one_line(tmp_path, damage, message):
    if damage is not None:
        (tmp_path / CHECKPOINT_FILE).write_bytes(damage)
    with pytest.raises(UsageError, match=message):
        read_checkpoint(tmp_path)


def test_a_pending_checkpoint_is_never_read_and_is_committed_by_a_rename(tmp_path):
    write_checkpoint(tmp_path, checkpoint_of(version=3), pending=True)
    with pytest.raises(UsageError, match=r"no checkpoint\.h5 .* its checkpoint\.pending\.h5 was never committed"):
        read_checkpoint(tmp_path)
    write_checkpoint(tmp_path, checkpoint_of(version=5), pending=True)  # a later one replaces it
    commit_checkpoint(tmp_path)
    assert read_checkpoint(tmp_path).version == 5 and not (tmp_path / PENDING_FILE).exists()


def test_a_resumed_job_may_change_only_how_long_it_runs(tmp_path):
    write_checkpoint(tmp_path, checkpoint_of(["optim.lr=0.1"]))
    job, ckpt = resume_job(tmp_path, None, [])
    assert job.optim.lr == 0.1 and ckpt.version == 7
    job, _ = resume_job(tmp_path, None, ["stop.iterations=500", "checkpoint.every_seconds=60"])
    assert (job.stop.iterations, job.checkpoint.every_seconds, job.optim.lr) == (500, 60.0, 0.1)
    with pytest.raises(UsageError, match=r"the job differs from the run's in optim\.lr, sync\.model"):
        resume_job(tmp_path, None, ["optim.lr=0.2", "sync.model=asp"])


@pytest.mark.parametrize("name", POLICIES)
def test_a_policy_resumes_with_its_push_counts_and_barriers(name):
    policy = make_policy(SyncConfig(model=name), 3)
    policy.start(0.0)
    for t in range(1, 30):
        w = t % 3
        if w not in policy.held:
            policy.on_push(w, t / 10)
    again = make_policy(SyncConfig(model=name), 3)
    again.load_state_dict(json.loads(json.dumps(policy.state_dict())))
    assert again.done.tolist() == policy.done.tolist() and again.barriers == policy.barriers
    assert again.held == set()
    with pytest.raises(ValueError, match="cannot resume"):
        make_policy(SyncConfig(model=name), 4).load_state_dict(policy.state_dict())


# -- the single process ------------------------------------------------------------------------------


def test_the_single_process_resumed_equals_it_run_through(tmp_path):
    # evaluations only at each part's end (the job's, kept by the resume)
    whole = local(tmp_path / "whole", "stop.iterations=60", "sync.workers=2", "eval.every_seconds=1000")
    assert whole.returncode == 0, whole.stderr
    first = local(tmp_path / "split", "stop.iterations=30", "sync.workers=2", "eval.every_seconds=1000")
    assert first.returncode == 0, first.stderr
    second = subprocess.run([sys.executable, "-m", "ebsp_mpi", "train", "-q", "--resume", str(tmp_path / "split"),
                             "--set", "stop.iterations=60"], capture_output=True, text=True, timeout=120,
                            env=child_env())
    assert second.returncode == 0, second.stderr
    a, attrs_a = read_model(tmp_path / "whole" / "model.h5")
    b, attrs_b = read_model(tmp_path / "split" / "model.h5")
    assert attrs_a["version"] == attrs_b["version"] == 60
    assert max(float(np.abs(a[k] - b[k]).max()) for k in a) <= 1e-5
    s = json.loads((tmp_path / "split" / "summary.json").read_text())
    assert s["iterations"] == [60, 60] and len(s["evals"]) == 2  # the first part's final evaluation is kept


# -- MPI: kill -9 and SIGTERM, then resume -----------------------------------------------------------


def _stop_mid_run(out: Path, sig: int, *overrides: str) -> subprocess.CompletedProcess:
    """Start a 3-rank run, and once it has trained for about 1.5 s (of about 5) send `sig` to every
    rank, as Slurm does at a time limit; the launcher's result."""
    proc = subprocess.Popen(train_cmd(3, out, *overrides), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env=child_env())
    try:
        deadline = time.monotonic() + 60
        while not (out / "trace" / "rank-0002.h5").exists() and time.monotonic() < deadline:
            time.sleep(0.1)
        time.sleep(1.5)  # set-up done: training, a few checkpoints in
        for rank in range(3):
            for pid in pids_of_rank(out, rank):
                # a rank may be gone already: the launcher ends the job once a rank is killed
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, sig)
        stdout, stderr = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    return subprocess.CompletedProcess(proc.args, proc.returncode, stdout, stderr)


@pytest.fixture(scope="module")
def unbroken(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("unbroken") / "run"
    p = train(3, out, *BSP, timeout=240)
    assert p.returncode == 0, p.stderr
    return out


def _same_model(a_dir: Path, b_dir: Path) -> float:
    a, attrs_a = read_model(a_dir / "model.h5")
    b, attrs_b = read_model(b_dir / "model.h5")
    assert attrs_a["version"] == attrs_b["version"]
    return max(float(np.abs(a[k] - b[k]).max()) for k in a)


@pytest.mark.skipif(not Path("/proc").is_dir(), reason="finds the ranks through /proc")
@pytest.mark.timeout(600)
def test_bsp_killed_mid_run_and_resumed_equals_bsp_run_through(unbroken, tmp_path):
    out = tmp_path / "run"
    killed = _stop_mid_run(out, signal.SIGKILL, *BSP, f"checkpoint.every_seconds={EVERY}")
    assert killed.returncode != 0 and not (out / "summary.json").exists()
    ckpt = read_checkpoint(out, arrays=False)
    with h5py.File(out / "trace" / "rank-0000.h5", "r") as f:  # the killed run's last flushed push
        last_push = float(f["pushes"]["t"].max())
    assert 0 < ckpt.version < 200
    assert last_push - ckpt.run_seconds <= EVERY + 0.5  # lost: at most the work since the last checkpoint

    resumed = resume(3, out)
    assert resumed.returncode == 0, resumed.stderr
    assert _same_model(unbroken, out) <= 1e-5
    s = json.loads((out / "summary.json").read_text())
    assert s["iterations"] == [200, 200] and s["barriers"] == 200 and s["wall_seconds"] > ckpt.run_seconds
    traces = read_run(out)  # one trace per rank, continued: every iteration once, in order, or said lost
    for rank in (1, 2):
        rows = traces[rank].tables["iterations"]["iteration"].tolist()
        # the checkpoint resumed from was committed once every worker's trace held what it counts
        assert rows == list(range(200)) and "lost_iterations" not in traces[rank].attrs, rows
    assert len(traces[0].tables["pushes"]) == 400


@pytest.mark.mpi_impl
@pytest.mark.timeout(300)
def test_a_checkpoint_is_committed_only_once_every_worker_has_flushed_its_trace(tmp_path):
    """A worker killed (SIGKILL) as the run's second checkpoint asks it to flush its trace: that
    checkpoint was never committed, the first is the run's, and the resumed run's traces hold every
    iteration once, none said lost. (Committed at once, the second would count iterations whose rows
    died in the worker's buffer: timed flushes are off here.)"""
    out = tmp_path / "run"
    job = ["sync.model=asp", "stop.iterations=100", "straggler.base_s=0.01", f"checkpoint.every_seconds={EVERY}",
           "trace.flush_seconds=600"]
    killed = train(3, out, *job, extra_env={"EBSP_INJECT_FAULT": "2:flush:kill"}, timeout=120)
    assert killed.returncode != 0 and not (out / "summary.json").exists(), killed.stderr
    assert "rank 2 kills itself at the second request to flush the trace" in killed.stderr, killed.stderr
    first = read_checkpoint(out, arrays=False)
    before = read_run(out)
    for rank in (1, 2):  # what the committed checkpoint counts is in each worker's trace
        rows = before[rank].tables["iterations"]["iteration"]
        assert set(range(first.iterations[rank - 1])) <= set(rows.tolist()), (first.iterations, rows)
    resumed = resume(3, out, timeout=120)
    assert resumed.returncode == 0, resumed.stderr
    traces = read_run(out)
    for rank in (1, 2):
        rows = traces[rank].tables["iterations"]["iteration"].tolist()
        assert rows == list(range(100)) and "lost_iterations" not in traces[rank].attrs, rows
    assert len(traces[0].tables["pushes"]) == 200


@pytest.mark.mpi_impl
@pytest.mark.skipif(not Path("/proc").is_dir(), reason="finds the ranks through /proc")
@pytest.mark.timeout(600)
def test_a_sigtermed_run_exits_0_after_its_checkpoint_and_resumes_to_the_same_model(unbroken, tmp_path):
    out = tmp_path / "run"
    stopped = _stop_mid_run(out, signal.SIGTERM, *BSP)  # no periodic checkpoint: the one on SIGTERM
    assert stopped.returncode == 0, stopped.stderr
    assert "SIGTERM" in stopped.stderr
    first = json.loads((out / "summary.json").read_text())
    assert 0 < first["iterations"][0] < 200
    assert read_checkpoint(out, arrays=False).iterations.tolist() == first["iterations"]
    resumed = resume(3, out)
    assert resumed.returncode == 0, resumed.stderr
    assert _same_model(unbroken, out) <= 1e-5


@pytest.mark.skipif(not Path("/proc").is_dir(), reason="finds the ranks through /proc")
@pytest.mark.timeout(600)
@pytest.mark.parametrize("model", ["asp", "ssp", "dssp", "elasticbsp"])
def test_every_sync_model_resumes_after_kill_9_and_trains_as_far(model, tmp_path):
    job = [f"sync.model={model}", "stop.iterations=200", "straggler.base_s=0.02", "straggler.slowdown=[1, 2]",
           "optim.momentum=0.5", f"checkpoint.every_seconds={EVERY}"]
    killed = _stop_mid_run(tmp_path / "run", signal.SIGKILL, *job)
    assert killed.returncode != 0
    resumed = resume(3, tmp_path / "run")
    assert resumed.returncode == 0, resumed.stderr
    s = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert s["iterations"] == [200, 200]
    assert s["test_accuracy"] >= 0.93  # the digits MLP after 200 iterations of each worker, unbroken: 0.95-0.97


@pytest.mark.parametrize("case, message", [
    ("no checkpoint", "no checkpoint.h5"),
    ("changed job", "the job differs from the run's in optim.lr"),
    ("other world size", "the run had 2 workers, this launch has 3"),
])
def test_resume_refuses_what_it_cannot_continue(case, message, tmp_path):
    out = tmp_path / "run"
    if case != "no checkpoint":
        assert train(3, out, "stop.iterations=5").returncode == 0
    else:
        out.mkdir()
    ranks = 4 if case == "other world size" else 3
    p = resume(ranks, out, *(["optim.lr=0.3"] if case == "changed job" else []), timeout=120)
    assert p.returncode == 2, p.stderr
    assert message in p.stderr and p.stderr.count("ebsp_mpi: error") == 1, p.stderr


@pytest.mark.skipif(not Path("/proc").is_dir(), reason="finds the ranks through /proc")
@pytest.mark.timeout(600)
def test_bsp_with_sufficient_factors_killed_and_resumed_equals_it_run_through(tmp_path):
    """Under BSP with comm.hybrid = "sfb" the workers step the SFB layers themselves: a resumed worker
    takes their optimizer state from the checkpoint, and its first pull brings every tensor."""
    job = [*BSP, "comm.hybrid=sfb"]
    whole = train(3, tmp_path / "whole", *job, timeout=240)
    assert whole.returncode == 0, whole.stderr
    killed = _stop_mid_run(tmp_path / "run", signal.SIGKILL, *job, f"checkpoint.every_seconds={EVERY}")
    assert killed.returncode != 0
    assert 0 < read_checkpoint(tmp_path / "run", arrays=False).version < 200
    resumed = resume(3, tmp_path / "run")
    assert resumed.returncode == 0, resumed.stderr
    assert _same_model(tmp_path / "whole", tmp_path / "run") <= 1e-5
