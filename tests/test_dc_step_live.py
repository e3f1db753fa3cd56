"""The live server never applies a push whose delay-compensated step (``optim.staleness = dc``) is
not finite: with one server it rejects it, as the emulation does (an exact replay of the run takes
the same decisions and ends with the same weights); with several servers, where each sees only its
shard of the step, the run stops in one line rather than apply it."""

import json
import subprocess
import sys

import numpy as np
import pytest

from ebsp_mpi.outputs import read_model
from mpirun import child_env, max_abs_difference, train

DIVERGING = ["sync.model=asp", "optim.staleness=dc", "optim.dc_lambda=1e30", "stop.epochs=0", "stop.iterations=30",
             "eval.every_seconds=100"]


@pytest.mark.timeout(300)
def test_a_step_that_is_not_finite_is_rejected_as_the_emulation_rejects_it(tmp_path):
    live = tmp_path / "live"
    p = train(3, live, *DIVERGING, timeout=180)
    assert p.returncode == 1 and "the training diverged" in p.stderr, p.stderr
    tensors, _ = read_model(live / "model.h5")
    assert all(np.isfinite(v).all() for v in tensors.values())  # before: Inf and NaN applied
    summary = json.loads((live / "summary.json").read_text())
    assert summary["rejected_pushes"] > 0
    p = subprocess.run([sys.executable, "-m", "ebsp_mpi", "simulate", "-q", "--replay", str(live), "--train", "--out",
                        str(tmp_path / "replay")], capture_output=True, text=True, timeout=180, env=child_env())
    assert p.returncode == 1, p.stderr
    replayed = json.loads((tmp_path / "replay" / "summary.json").read_text())
    assert replayed["simulation"]["exact_replay"] is True
    assert replayed["rejected_pushes"] == summary["rejected_pushes"]
    assert max_abs_difference(live, tmp_path / "replay") == 0.0


@pytest.mark.timeout(300)
def test_with_two_servers_a_step_that_is_not_finite_stops_the_run(tmp_path):
    p = train(4, tmp_path / "run", *DIVERGING, "runtime.servers=2", timeout=180)
    assert p.returncode != 0
    stopped = [line for line in p.stderr.splitlines() if "stopped:" in line]
    assert stopped and "the delay-compensated step of worker" in stopped[0] and "is not finite" in stopped[0]
