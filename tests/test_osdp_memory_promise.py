"""OSDP's promise, as ``jobs/osdp/measure.sh`` checks it, small: the wide MLP planned under two memory
limits and trained a few iterations on one worker; the peak a worker measures stays within 2 % of what
its plan predicts (docs/osdp.md: -0.1 % to +0.3 % on NumPy). A worker that allocates what no plan
counts (zeros the size of the model for the NaN/Inf check of its push measured +47 % at 24 MiB) fails
here, not only in a documented table nobody reruns."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from mpirun import child_env, train

JOB = Path(__file__).resolve().parents[1] / "jobs" / "osdp" / "wide-mlp.toml"
#: 24 MiB keeps most layers resident (one on demand), 8 MiB puts three in slices (measure.sh's rows)
LIMITS = ("24MiB", "8MiB")
#: the most a measured peak may exceed its prediction (a fraction)
ABOVE = 0.02


def _cli(*args: str) -> None:
    p = subprocess.run([sys.executable, "-m", "ebsp_mpi", *args, "-q"], capture_output=True, text=True,
                       timeout=300, env=child_env())
    assert p.returncode == 0, p.stderr


@pytest.fixture(scope="module")
def profile(tmp_path_factory) -> Path:
    """The wide MLP's profile: a few timed steps (the plan's memory does not depend on the times), the
    network given rather than benchmarked."""
    out = tmp_path_factory.mktemp("profile") / "wide.json"
    _cli("profile", str(JOB), "--reps", "3", "--warmup", "1", "--latency", "5e-6", "--bandwidth", "5GB/s",
         "--out", str(out))
    return out


@pytest.mark.timeout(300)
@pytest.mark.parametrize("limit", LIMITS)
def test_a_workers_measured_peak_is_its_plans_prediction(limit, profile, tmp_path):
    plan = tmp_path / "plan.json"
    _cli("plan", str(JOB), "--profile", str(profile), "--memory-limit", limit, "--out", str(plan))
    out = tmp_path / "run"
    p = train(2, out, f"osdp.plan={plan}", "stop.iterations=8", "eval.every_seconds=1e9", job=JOB, timeout=240)
    assert p.returncode == 0, p.stderr
    osdp = json.loads((out / "summary.json").read_text())["osdp"]
    predicted, (measured,) = osdp["predicted"]["peak_bytes"], osdp["measured"]["peak_bytes"]
    print(f"{limit}: predicted {predicted / 2**20:.2f} MiB, measured {measured / 2**20:.2f} MiB")  # pytest -s
    assert measured <= (1 + ABOVE) * predicted, (limit, predicted, measured)
