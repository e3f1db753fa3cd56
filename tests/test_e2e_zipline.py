"""End to end: ElasticBSP with robust ZipLine under ``mpiexec``, its σ and z in the server's trace."""

import json

import numpy as np
import pytest

from ebsp_mpi.trace import read_run
from mpirun import train

pytestmark = [pytest.mark.timeout(600), pytest.mark.slow]


def test_live_robust_zipline_learns_sigma_and_traces_it(tmp_path):
    p = train(4, tmp_path, "sync.model=elasticbsp", "sync.lookahead=6", "sync.zipline_z=auto",
              "sync.predictor=ema", "stop.iterations=60", "straggler.slowdown=[1, 1, 3]",
              "straggler.base_s=0.004", "straggler.jitter_sigma=0.2")
    assert p.returncode == 0, p.stderr
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["config"]["sync"]["zipline_z"] == "auto"
    server = read_run(tmp_path)[0]
    barriers, members = server.tables["barriers"], server.tables["barrier_members"]
    assert len(barriers) == summary["barriers"] >= 3
    assert barriers["z"][0] == 0.0 and (np.diff(barriers["z"]) >= 0).all()  # AutoZ only moves up
    assert (members["sigma"][members["barrier"] == 0] == 0).all()  # nothing learned before the first
    assert (members["sigma"][members["barrier"] >= 1] > 0).any()
    assert (barriers["predicted_interval_spread"] >= barriers["predicted_spread"] - 1e-12).all()
