"""What a run says while it runs and as it ends: the progress line (its rate after a resume, ETA,
samples/s, what it counts), the server's first line and the last line."""

from __future__ import annotations

import io
import re
import subprocess
import sys

import pytest

from ebsp_mpi.outputs import describe_run
from ebsp_mpi.progress import Progress
from ebsp_mpi.runtime.servers.server import stop_text
from mpirun import child_env, train_cmd

RATE = re.compile(r"^(\d+)/\d+ (?:it|pushes)\b.*?\s([\d.]+) s\s+([\d.]+) (?:it|pushes)/s")


def test_a_resumed_runs_rate_and_eta_count_only_what_this_process_did():
    p = Progress(1000, stream=io.StringIO(), start=800, samples_per_unit=32)
    text, frac = p.line(900, {}, elapsed=2.0)
    assert frac == 0.9
    assert "50.0 it/s" in text and "1600 samples/s" in text and "ETA 2 s" in text, text


def test_the_count_says_what_it_counts_and_the_eta_reads_as_a_duration():
    p = Progress(10_000, unit="pushes", counts="summed over 4 workers", stream=io.StringIO())
    text, _ = p.line(100, {}, elapsed=10.0)
    assert text.startswith("100/10000 pushes summed over 4 workers (  1%)"), text
    assert "10.0 pushes/s" in text and "ETA 16 min 30 s" in text, text
    final, _ = p.line(10_000, {}, elapsed=100.0, final=True)
    assert "ETA" not in final


def test_a_run_that_stops_at_a_time_shows_the_time_left_as_its_eta():
    p = Progress(None, stream=io.StringIO(), stop_seconds=60.0, clock_start=20.0)
    text, frac = p.line(500, {}, elapsed=10.0)
    assert frac is None and "ETA 30 s" in text, text
    sooner, _ = Progress(600, stream=io.StringIO(), stop_seconds=60.0).line(500, {}, elapsed=10.0)
    assert "ETA 2 s" in sooner, sooner  # the iteration limit comes first


def test_a_log_gets_the_final_line_once():
    out = io.StringIO()
    p = Progress(5, stream=out, log_every_s=0.0)
    p.update(5)
    p.close(5)
    assert len(out.getvalue().splitlines()) == 1, out.getvalue()


@pytest.mark.parametrize("limits, seconds, says", [
    ([None, None, None, None], 60.0, "stop at 60 s"),
    ([300, 300], 0.0, "stop at 300 iterations per worker"),
    ([300, 200], 10.0, "stop at [300, 200] iterations or 10 s"),
])
def test_the_servers_first_line_says_when_the_run_stops(limits, seconds, says):
    assert stop_text(limits, seconds) == says


def test_a_single_process_does_not_speak_of_rejected_pushes():
    summary = {"sync": "single", "workers": 1, "world_size": 1, "wall_seconds": 1.0, "test_accuracy": 0.9,
               "test_loss": 0.3, "rejected_pushes": 0}
    assert "rejected" not in describe_run(summary, "runs/x")
    assert "0 rejected pushes" in describe_run({**summary, "world_size": 3}, "runs/x")


def _last_rate(stderr: str) -> tuple[int, float, float]:
    """The last progress line's count, seconds and rate."""
    lines = [m for m in map(RATE.match, stderr.splitlines()) if m]
    assert lines, stderr
    done, elapsed, rate = lines[-1].groups()
    return int(done), float(elapsed), float(rate)


@pytest.mark.timeout(240)
@pytest.mark.parametrize("ranks", [1, 3])
def test_after_a_resume_the_rate_counts_only_the_resumed_work(ranks, tmp_path):
    """Before: all iterations over the time since the resume (18041.4 it/s on its first line)."""
    out = tmp_path / "run"
    # the line shows its seconds to 0.1 s: each leg long enough (0.7 s or more here) that the rounding
    # cannot hide a rate of all the iterations (twice this leg's)
    half = 6000 if ranks == 1 else 1500
    job = ["stop.epochs=0", "straggler.enabled=false", "eval.every_seconds=1e9", f"stop.iterations={half}"]
    if ranks == 1:
        first = [sys.executable, "-m", "ebsp_mpi", "train", "-q", "--out", str(out)]
        first += [a for o in job for a in ("--set", o)]
    else:
        first = train_cmd(ranks, out, *job)
    assert subprocess.run(first, capture_output=True, text=True, timeout=120, env=child_env()).returncode == 0
    again = [a for a in first if a != "-q"]
    again[again.index("--out")] = "--resume"
    again = again[:again.index("--resume") + 2] + ["--set", f"stop.iterations={2 * half}"]
    p = subprocess.run(again, capture_output=True, text=True, timeout=120, env=child_env())
    assert p.returncode == 0, p.stderr
    done, elapsed, rate = _last_rate(p.stderr)
    workers = max(1, ranks - 1)
    assert done == 2 * half * workers
    # the line's rate times its seconds is what this process did (half of it), not all of it; its
    # seconds are rounded to 0.1 s, its rate to 0.1 it/s
    assert elapsed >= 0.3, p.stderr
    assert rate * (elapsed - 0.05) * 0.98 <= half * workers <= rate * (elapsed + 0.05) * 1.02, p.stderr
