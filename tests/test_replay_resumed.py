"""``simulate --replay`` of runs that were killed and resumed: each restart answers every worker once
more (its first pull), so a worker's k-th reply is no longer the one that started its k-th iteration.
Paired by index, a resumed ASP run of 9,805 pushes replayed as 6,620; paired by time, the replay of
a run resumed once and twice agrees with it within the 10 % of ``tests/test_simulate_live.py``.
"""

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
import warnings
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("pandas")  # the analysis extra

from ebsp_mpi.analysis.metrics import worker_stats  # needs pandas
from ebsp_mpi.checkpoint import CHECKPOINT_FILE
from ebsp_mpi.sim.workers import read_recording
from ebsp_mpi.trace.frames import load_run
from mpirun import child_env, pids_of_rank, resume, train_cmd

TOLERANCE = 0.10  # as tests/test_simulate_live.py: relative, per worker and per figure

#: 4 workers, worker 3 three times slower, 10 ms of emulated compute with jitter, checkpoints every
#: 0.3 s; long enough to be killed twice and resumed
COMMON = ["straggler.slowdown=[1, 1, 1, 3]", "straggler.jitter_sigma=0.2", "straggler.base_s=0.01",
          "stop.iterations=240", "stop.epochs=0", "stop.seconds=0", "eval.every_seconds=1000", "optim.momentum=0.5",
          "checkpoint.every_seconds=0.3", "trace.flush_seconds=0.1"]
MODELS = {
    "asp": ["sync.model=asp"],
    "ssp": ["sync.model=ssp", "sync.staleness=2"],
    "elasticbsp": ["sync.model=elasticbsp", "sync.lookahead=15"],
}


def kill_mid_run(cmd: list[str], out: Path, trained: float) -> None:
    """Start `cmd` (a 5-rank train), and once its checkpoint has moved on for `trained` seconds of
    training past where it stood, kill every rank with SIGKILL (a node lost, a job killed)."""
    ckpt = out / CHECKPOINT_FILE
    before = ckpt.stat().st_mtime_ns if ckpt.exists() else 0
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=child_env())
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and not (ckpt.exists() and ckpt.stat().st_mtime_ns != before):
            assert proc.poll() is None, "the run ended before it could be killed"
            time.sleep(0.05)
        time.sleep(trained)
        assert proc.poll() is None, "the run ended before it could be killed"
        for rank in range(5):
            for pid in pids_of_rank(out, rank):
                # a rank may be gone already: the launcher ends the job once a rank is killed
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
        proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    deadline = time.monotonic() + 10  # the launcher may return before its killed ranks are gone
    while any(pids_of_rank(out, r) for r in range(5)) and time.monotonic() < deadline:
        time.sleep(0.1)


def stats(run_dir: Path):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # a simulated run's trace has no losses (NaN)
        return worker_stats(load_run(run_dir))


def replay(live: Path, out: Path) -> dict:
    q = subprocess.run([sys.executable, "-m", "ebsp_mpi", "simulate", "--replay", str(live), "--out", str(out), "-q"],
                       capture_output=True, text=True, timeout=180, env=child_env())
    assert q.returncode == 0, q.stderr
    return json.loads((out / "summary.json").read_text())


#: each model once, killed once or twice: every restart is found and replayed by the same code as the
#: first (sim.workers, sim.restarts), so each model need not run both counts
RESUMES = {"asp": 2, "ssp": 1, "elasticbsp": 2}


@pytest.mark.slow
@pytest.mark.skipif(not Path("/proc").is_dir(), reason="finds the ranks through /proc")
@pytest.mark.timeout(600)
@pytest.mark.parametrize("model, resumes", RESUMES.items())
def test_a_replay_of_a_run_killed_and_resumed_agrees_with_it(model, resumes, tmp_path):
    live = tmp_path / "live"
    cmd = train_cmd(5, live, *COMMON, *MODELS[model])
    for _ in range(resumes):
        kill_mid_run(cmd, live, trained=0.8)
        cmd = train_cmd(5, live)
        cmd[cmd.index("--out")] = "--resume"
    p = resume(5, live, timeout=240)  # to its end
    assert p.returncode == 0, p.stderr
    assert json.loads((live / "summary.json").read_text())["iterations"] == [240] * 4

    # each restart answered every worker once more than it pushed: found, with where each worker was
    recording = read_recording(live)
    assert len(recording.restarts) == resumes, recording.restarts
    assert all(0 < c < 240 for r in recording.restarts for c in r.counts[3:]), recording.restarts  # the straggler
    for w, parts in enumerate(recording.parts):  # every iteration, each paired with the reply that started it
        assert len(parts.down) == 240 and np.all(parts.up >= 0) and np.all(parts.down >= 0), w

    sim = replay(live, tmp_path / "sim")
    assert sim["iterations"] == [240] * 4 and sim["simulation"]["restarts"] == [r.t for r in recording.restarts]
    # the last iteration before each restart waits as the recorded one did where its row survived,
    # with no second transit added to it (each restart's once made the replay's waits 2 - 12 % long)
    rows = load_run(tmp_path / "sim").table("iterations")
    for r in recording.restarts:
        for w, (count, wait) in enumerate(zip(r.counts, r.waits, strict=True)):
            if wait is not None and count > 0:
                got = rows[(rows.worker == w) & (rows.iteration == count - 1)].wait_s.item()
                assert got == pytest.approx(wait, abs=1e-9), (w, count, got, wait)
    a, b = stats(live), stats(tmp_path / "sim")
    for column in ("iterations_per_s", "wait_s"):
        off = (b[column] - a[column]).abs() / a[column]
        print(f"{model}, resumed {resumes}x: {column} largest relative difference {off.max():.2%}")  # pytest -s
        assert (off <= TOLERANCE).all(), (f"{model}: {column} live {a[column].round(4).tolist()}, "
                                          f"replayed {b[column].round(4).tolist()}")
