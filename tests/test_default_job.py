"""The default job, as README's first command trains it (a server and 4 workers): it evaluates often
enough that ``report`` draws an accuracy curve and ``compare`` a time to each target (at one evaluation
a second it evaluated once in its 2 s, then at its end)."""

from __future__ import annotations

import json

import pytest

from mpirun import train


@pytest.mark.timeout(300)
def test_the_default_job_evaluates_several_times_a_run(tmp_path):
    p = train(5, tmp_path / "run")
    assert p.returncode == 0, p.stderr
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    times = [e["t"] for e in summary["evals"]]
    print(f"{summary['wall_seconds']:.2f} s, evaluations at {times}")  # pytest -s
    assert len(times) >= 4 and times == sorted(times), times
    assert times[0] < summary["wall_seconds"] / 2, times  # the curve starts early in the run
