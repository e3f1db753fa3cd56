"""Ctrl-C stops a run as SIGTERM does: one line, a final checkpoint, exit code 130, and (under mpiexec)
no shared memory left in /dev/shm. A terminal sends SIGINT to the foreground process group: here the
launcher's, started in a session of its own."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from ebsp_mpi.checkpoint import read_checkpoint
from mpirun import child_env, pids_of_rank, train_cmd

pytestmark = pytest.mark.skipif(not Path("/proc").is_dir(), reason="finds the ranks through /proc")

LONG = ("stop.seconds=120", "stop.epochs=0", "straggler.base_s=0.01")


def _ctrl_c(cmd: list[str], ready, before_signal=lambda: None) -> subprocess.CompletedProcess:
    """Start `cmd` in a process group of its own, wait until `ready()`, then send SIGINT to the whole
    group (what Ctrl-C does) and wait for it to end."""
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=child_env(),
                            start_new_session=True)
    try:
        deadline = time.monotonic() + 60
        while not ready() and time.monotonic() < deadline and proc.poll() is None:
            time.sleep(0.1)
        time.sleep(1.0)  # training
        before_signal()
        os.killpg(proc.pid, signal.SIGINT)
        stdout, stderr = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    return subprocess.CompletedProcess(cmd, proc.returncode, stdout, stderr)


def _ours(stderr: str) -> list[str]:
    """The lines of stderr that this program wrote (not the launcher's own)."""
    return [line for line in stderr.splitlines() if line.strip() and not line.startswith("[mpiexec@")]


def _stopped_with_a_checkpoint(run: Path) -> None:
    summary = json.loads((run / "summary.json").read_text())
    assert 0 < summary["iterations"][0], summary["iterations"]
    assert read_checkpoint(run, arrays=False).iterations.tolist() == summary["iterations"]


def _shm_files_of(pid: int) -> set[str]:
    """The /dev/shm files that process `pid` maps (MPICH's and Open MPI's shared memory)."""
    with open(f"/proc/{pid}/maps") as f:
        return {line.split(None, 5)[5].strip() for line in f if "/dev/shm/" in line}


@pytest.mark.timeout(180)
def test_ctrl_c_under_mpiexec_checkpoints_exits_130_and_leaves_no_shared_memory(tmp_path):
    out = tmp_path / "run"
    shm: set[str] = set()

    def note_shm():
        for pid in pids_of_rank(out, 0):
            shm.update(_shm_files_of(pid))

    p = _ctrl_c(train_cmd(3, out, *LONG), lambda: (out / "trace" / "rank-0002.h5").exists(), note_shm)
    assert p.returncode == 130, p.stderr
    lines = _ours(p.stderr)
    assert len(lines) == 1 and "Ctrl-C (SIGINT): the run stops" in lines[0], p.stderr
    _stopped_with_a_checkpoint(out)
    assert shm, "rank 0 mapped no file of /dev/shm: nothing to check"
    assert not [f for f in shm if Path(f).exists()], (shm, p.stderr)


@pytest.mark.timeout(120)
def test_ctrl_c_in_a_single_process_checkpoints_and_exits_130(tmp_path):
    out = tmp_path / "run"
    job = (*LONG, "checkpoint.every_seconds=0.5")  # its first checkpoint: training has begun
    cmd = [sys.executable, "-m", "ebsp_mpi", "train", "-q", "--out", str(out), *(f"--set={o}" for o in job)]
    p = _ctrl_c(cmd, lambda: (out / "checkpoint.h5").exists())
    assert p.returncode == 130, p.stderr
    lines = _ours(p.stderr)
    assert len(lines) == 1 and "Ctrl-C (SIGINT): stopped at step" in lines[0], p.stderr
    _stopped_with_a_checkpoint(out)
