"""The command blocks of docs/simulation.md and docs/osdp.md run as the docs show them, one line after
the other, and each shows what it is there to show: the simulated ElasticBSP run waits on its
stragglers, the replay replays the live run made just before it, and the plan made by the lines before
it is the one the run trains with. Runs are made short (:func:`shorten`); they run in a scratch
folder, which stands for /tmp too.
"""

from __future__ import annotations

import json
import shlex
import sys
from pathlib import Path

import pytest

from mpirun import train_cmd
from test_readme import run_argv

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

ROOT = Path(__file__).resolve().parents[1]


def block(doc: str, first: str) -> list[str]:
    """The lines of the indented code block of docs/`doc` whose first line contains `first`."""
    lines = (ROOT / "docs" / doc).read_text(encoding="utf-8").splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("    ") and first in line)
    assert start == 0 or not lines[start - 1].startswith("    "), f"{doc}: {first!r} does not start a block"
    out = []
    for line in lines[start:]:
        if not line.startswith("    "):
            break
        out.append(line.strip())
    return out


def shorten(argv: list[str]) -> list[str]:
    """A short run of the same kind: a few seconds of training, 20 pushes per simulated worker."""
    sub = argv[argv.index("ebsp_mpi") + 1]
    if sub == "train":
        argv += ["--set", "stop.seconds=1.5"] if "stragglers" in " ".join(argv) else ["--set", "stop.iterations=5"]
    elif sub == "simulate" and "--iterations" in argv:
        argv[argv.index("--iterations") + 1] = "20"
    elif sub == "profile":
        argv += ["--reps", "3", "--warmup", "1"]
    return argv + ["-q"] if sub in ("train", "simulate", "profile", "plan") else argv


def run_block(lines: list[str], tmp: Path, link_jobs: bool = True) -> dict[str, Path]:
    """Run each line in `tmp` (which links to the repository's ``jobs/``), with /tmp/ as `tmp`; every
    line must exit 0. Returns the paths the lines named after --out or --json (by their name)."""
    if link_jobs:
        (tmp / "jobs").symlink_to(ROOT / "jobs")
    outs = {}
    for line in lines:
        argv = shlex.split(line.replace("/tmp/", f"{tmp}/"), comments=True)
        if argv[0] == "mpiexec":
            n = argv.index("-n")
            cmd = train_cmd(int(argv[n + 1]), "unused")
            argv = [*cmd[:cmd.index("-n")], *argv[n:]]
        argv = shorten([sys.executable if a == "python" else a for a in argv])
        p = run_argv(argv, tmp, 300)
        assert p.returncode == 0, f"{line}\n{p.stdout[-2000:]}\n{p.stderr[-2000:]}"
        for i, a in enumerate(argv[:-1]):
            if a in ("--out", "--json"):
                outs[Path(argv[i + 1]).name] = Path(argv[i + 1])
    return outs


def test_simulation_md_simulates_stragglers_and_replays_the_run_it_made(tmp_path):
    lines = block("simulation.md", "simulate jobs/stragglers/base.toml")
    outs = run_block(lines, tmp_path)
    sim = json.loads((outs["sim"] / "summary.json").read_text())
    assert sim["sync"] == "elasticbsp" and sum(sim["wait_seconds"]) > 0, sim["wait_seconds"][:8]
    assert (outs["sim-report"] / "report.md").is_file()
    replayed = json.loads((outs["replayed"] / "summary.json").read_text())["simulation"]
    assert Path(replayed["replay"]).resolve() == outs["live"].resolve(), replayed
    # the block of --train further down: its replay retrains the same run, to the live accuracy
    outs = run_block(block("simulation.md", "simulate --train --workers 64"), tmp_path, link_jobs=False)
    live = json.loads((tmp_path / "live" / "summary.json").read_text())
    retrained = json.loads((outs["retrained"] / "summary.json").read_text())
    assert retrained["test_accuracy"] == live["test_accuracy"], (retrained["test_accuracy"], live["test_accuracy"])


def test_osdp_md_trains_with_the_plan_the_lines_before_it_made(tmp_path):
    lines = block("osdp.md", "bench mpi --json /tmp/mpi.json")
    outs = run_block(lines, tmp_path)
    plan = json.loads(outs["plan.json"].read_text())
    runs = sorted((tmp_path / "runs").glob("wide-mlp-*"))
    assert len(lines) == 4 and "osdp.plan=" in lines[-1]
    # the run trained with the plan: its summary holds the plan's prediction
    summary = json.loads((_newest(runs) / "summary.json").read_text())
    predicted = summary["osdp"]["predicted"]
    assert predicted and all(predicted[k] == plan["predicted"][k] for k in predicted), (predicted, plan["predicted"])


def _newest(runs: list[Path]) -> Path:
    assert runs, "the train line made no run directory"
    return max(runs, key=lambda p: p.stat().st_mtime)
