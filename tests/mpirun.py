"""Launching ``mpiexec ... python -m ebsp_mpi train`` from the serial test pass, always with a timeout."""

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import NamedTuple

import numpy as np
import pytest

from ebsp_mpi.errors import UsageError
from ebsp_mpi.outputs import read_model
from ebsp_mpi.runtime.transport.env import (OPEN_MPI, cap_blas_threads, find_mpiexec, launch_env, launch_flags,
                                            mpi_implementation, rank_from_env, world_size_from_env)


def mpiexec() -> list[str]:
    """The launcher the sweeps use too: $MPIEXEC, else the mpiexec beside this Python (the PyPI
    MPICH/Open MPI wheels put it there), else mpiexec on PATH."""
    try:
        return find_mpiexec()
    except UsageError as e:
        pytest.skip(f"{e}")


def watchdog_flags() -> list[str]:
    """Launcher flags that let the job's own ranks name a dead rank (``env.launch_flags``): MPICH's
    ``-disable-auto-cleanup``; nothing for Open MPI, whose launcher names the rank itself. (Asked for
    one rank: the flags that depend on the number of ranks come with every :func:`train_cmd`.)"""
    return launch_flags(mpiexec(), 1, survivors_speak=True)


def dead_rank_named(rank: int, ours: str) -> str:
    """What a job's output says when `rank` was killed (kill -9) under :func:`watchdog_flags`: under
    Open MPI its launcher's ``prterun noticed that process rank 2 with PID 4242 on node n1 exited on
    signal 9 (Killed)`` (``mpirun noticed ...`` in Open MPI 4); under MPICH what the surviving ranks
    print (`ours`, e.g. ``rank 2 (worker 1, pid``)."""
    return f"noticed that process rank {rank} with PID" if mpi_implementation(mpiexec()) == OPEN_MPI else ours


def train_cmd(n: int, out, *overrides: str, job=None, flags=()) -> list[str]:
    cmd = [*mpiexec(), *launch_flags(mpiexec(), n), *flags, "-n", str(n), sys.executable, "-m", "ebsp_mpi", "train",
           "-q", "--out", str(out)]
    if job:
        cmd.append(str(job))
    for o in overrides:
        cmd += ["--set", o]
    return cmd


def child_env() -> dict:
    """The environment of a launched job: one BLAS thread per rank, no backend chosen, and what the
    launcher needs (Open MPI's permission to run as root, where the tests run as root)."""
    env = launch_env(mpiexec(), cap_blas_threads(dict(os.environ)))
    env.pop("EBSP_BACKEND", None)
    return env


def train(n: int, out, *overrides: str, job=None, timeout: float = 240,
          extra_env: dict | None = None) -> subprocess.CompletedProcess:
    """Run a job under mpiexec; fail (not hang) when it passes `timeout` seconds."""
    try:
        return subprocess.run(train_cmd(n, out, *overrides, job=job), capture_output=True, text=True,
                              timeout=timeout, env={**child_env(), **(extra_env or {})})
    except subprocess.TimeoutExpired as e:
        pytest.fail(f"mpiexec -n {n} train did not finish in {timeout} s:\n{e.stdout}\n{e.stderr}")


def resume(n: int, run_dir, *overrides: str, timeout: float = 240) -> subprocess.CompletedProcess:
    """``train --resume run_dir`` under mpiexec (`overrides` may change only how long it runs); fail
    (not hang) when it passes `timeout` seconds."""
    cmd = train_cmd(n, run_dir, *overrides)
    cmd[cmd.index("--out")] = "--resume"
    try:
        return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=child_env())
    except subprocess.TimeoutExpired as e:
        pytest.fail(f"mpiexec -n {n} train --resume did not finish in {timeout} s:\n{e.stdout}\n{e.stderr}")


def local(out, *overrides: str, job=None, timeout: float = 240) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "ebsp_mpi", "train", "-q", "--out", str(out)]
    if job:
        cmd.append(str(job))
    for o in overrides:
        cmd += ["--set", o]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=child_env())


def oracle_run(tmp_path_factory, *overrides: str) -> Path:
    """The single-process oracle of `overrides` in a fresh directory, for a module-scoped fixture: the
    runs of a test file that are held against one oracle share it."""
    out = tmp_path_factory.mktemp("oracle") / "run"
    p = local(out, *overrides)
    assert p.returncode == 0, p.stderr
    return out


def pids_of_rank(out_dir: Path, rank: int) -> list[int]:
    """The PIDs of rank `rank` of the run writing to `out_dir` (found through /proc, by the rank the
    launcher gave it: ``env.rank_from_env``)."""
    pids = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            cmdline = (proc / "cmdline").read_bytes().split(b"\0")
            environ = (proc / "environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if str(out_dir).encode() in cmdline and b"ebsp_mpi" in cmdline:
            env = dict(var.decode(errors="replace").partition("=")[::2] for var in environ if b"=" in var)
            if world_size_from_env(env) > 1 and rank_from_env(env) == rank:  # MPICH's PMI_RANK, Open MPI's
                pids.append(int(proc.name))
    return pids


class Ended(NamedTuple):
    """How a signalled run ended: the launcher's exit code, its output, and the run directory."""

    code: int
    output: str
    run: Path


def signal_rank_mid_run(tmp_path: Path, rank: int, sig: int, stall: float, *overrides: str, flags=(),
                        after: float = 1.0, ranks: int = 3) -> Ended:
    """Start a `ranks`-rank run (120 s, an emulated 10 ms of compute per iteration) in ``tmp_path/run``, send
    `sig` to `rank` `after` seconds once every rank has built its part, and wait for the job to end.
    The test fails if it has not ended `stall` + 10 s after the signal. Ranks a launcher left behind
    (stopped ones) are killed."""
    tmp_path.mkdir(parents=True, exist_ok=True)
    out, log = tmp_path / "run", tmp_path / "log"  # a file: the launcher's output is read after the job ends
    last = out / "trace" / f"rank-{ranks - 1:04d}.h5"
    cmd = train_cmd(ranks, out, "stop.seconds=120", "stop.epochs=0", f"runtime.stall_timeout_s={stall}",
                    "trace.flush_seconds=0.2", "straggler.base_s=0.01", *overrides, flags=flags)
    proc = subprocess.Popen(cmd, stdout=log.open("w"), stderr=subprocess.STDOUT, env=child_env())
    pids, late = [], False
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not (pids and last.exists()):
            time.sleep(0.2)
            pids = pids_of_rank(out, rank)
        assert pids, f"rank {rank} never started"
        time.sleep(after)  # the last rank's trace file exists: it has built its part, the others may still be at it
        for pid in pids:
            os.kill(pid, sig)
        proc.wait(timeout=stall + 10)
    except subprocess.TimeoutExpired:
        late = True  # failed below, once the job is gone and its whole output written
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        # the launcher may return while the ranks it killed are still being torn down (holding file
        # locks), or leave a stopped one behind
        deadline = time.monotonic() + 10
        while any(pids_of_rank(out, r) for r in range(ranks)) and time.monotonic() < deadline:
            for r in range(ranks):
                for pid in pids_of_rank(out, r):
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(pid, signal.SIGKILL)
            time.sleep(0.1)
    if late:
        pytest.fail(f"{signal.Signals(sig).name} to rank {rank}: the job did not end within {stall + 10} s:\n"
                    f"{log.read_text()[-3000:]}")
    return Ended(proc.returncode, log.read_text(), out)


#: How many times a test kills a rank with SIGKILL before it gives up on hearing the rank named. MPICH's
#: Hydra now and then kills every rank within milliseconds of the death, even under
#: ``-disable-auto-cleanup`` (about 1 run in 8 on a 2-core machine), before any rank can write a word;
#: in practice the first attempt names it.
KILL_ATTEMPTS = 3


def signal_until_named(tmp_path: Path, rank: int, sig: int, stall: float, named: str, *overrides: str,
                       **kwargs) -> list[Ended]:
    """:func:`signal_rank_mid_run` (in ``tmp_path/attempt<k>``) until the job's output holds `named`:
    once for a signal that leaves the rank alive (SIGSTOP), up to :data:`KILL_ATTEMPTS` times for
    SIGKILL. Every attempt must end the job with a non-zero exit code, and one must hold `named`.
    Returns every attempt, the one that named the rank last."""
    attempts = KILL_ATTEMPTS if sig == signal.SIGKILL else 1
    ended: list[Ended] = []
    for k in range(attempts):
        ended.append(signal_rank_mid_run(tmp_path / f"attempt{k}", rank, sig, stall, *overrides, **kwargs))
        code, output, _ = ended[-1]
        assert code != 0, f"the job exited 0 after {signal.Signals(sig).name} to rank {rank}:\n{output[-3000:]}"
        if named in output:
            return ended
    pytest.fail(f"no attempt of {attempts} named {named!r}; the last one's output:\n{output[-3000:]}")


def max_abs_difference(a_dir: Path, b_dir: Path) -> float:
    """The largest difference between two runs' trained models (``model.h5``), which must have the
    same tensors and the same number of versions."""
    a, attrs_a = read_model(a_dir / "model.h5")
    b, attrs_b = read_model(b_dir / "model.h5")
    assert sorted(a) == sorted(b) and attrs_a["version"] == attrs_b["version"]
    return max(float(np.abs(a[k] - b[k]).max()) for k in a)
