"""The command line as a user meets it: one-line errors with exit code 2, and a full default run."""

import json
import re
import subprocess
import sys

import numpy as np
import pytest

from ebsp_mpi.outputs import read_model


def run(*args, cwd=None, timeout=120):
    return subprocess.run([sys.executable, "-m", "ebsp_mpi", *args], capture_output=True, text=True,
                          timeout=timeout, cwd=cwd)


@pytest.mark.parametrize("args, words", [
    (["train", "--set", "optim.lr=-1"], ["optim.lr", "> 0"]),
    (["train", "--set", "data.name=mnist"], ["data.root"]),
    (["train", "--set", "data.name=mnist", "--set", "data.root=/no/such/dir"], ["/no/such/dir"]),
    (["train", "--set", "backend=cupy"], ["cupy"]),
])
def test_usage_errors_are_one_line_with_exit_code_2(args, words, tmp_path, monkeypatch):
    monkeypatch.delenv("EBSP_BACKEND", raising=False)
    if "backend=cupy" in args:
        pytest.importorskip("numpy")
        try:
            import cupy  # noqa: F401
            pytest.skip("CuPy is installed here; the error path needs a machine without it")
        except ImportError:
            pass
    p = run(*args, "--out", str(tmp_path / "out"))
    assert p.returncode == 2, p.stderr
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("ebsp_mpi: error:"), p.stderr
    for word in words:
        assert word in lines[0]


def test_misspelt_key_in_job_file(tmp_path):
    job = tmp_path / "job.toml"
    job.write_text("[optim]\nlearning_rate = 0.1\n")
    p = run("train", str(job))
    assert p.returncode == 2
    assert p.stderr.count("\n") == 1 and "optim.learning_rate" in p.stderr


def test_existing_output_directory_is_not_overwritten(tmp_path):
    (tmp_path / "keep.txt").write_text("earlier run")
    p = run("train", "--out", str(tmp_path))
    assert p.returncode == 2 and "not empty" in p.stderr
    assert (tmp_path / "keep.txt").read_text() == "earlier run"


def test_config_prints_a_job_that_loads_again(tmp_path):
    p = run("config", "--set", "optim.lr=0.25")
    assert p.returncode == 0
    job = tmp_path / "job.toml"
    job.write_text(p.stdout)
    again = run("config", str(job))
    assert again.stdout == p.stdout and "lr = 0.25" in p.stdout


def test_default_job_trains_the_mlp_to_95_percent(tmp_path):
    """The README's first command at world size 1: MLP on digits, summary.json and model.h5."""
    p = run("train", "--out", str(tmp_path / "run"), "--quiet")
    assert p.returncode == 0, p.stderr
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["test_accuracy"] >= 0.95
    for key in ("sync", "workers", "wall_seconds", "iterations", "wait_seconds", "barriers", "rejected_pushes",
                "test_loss", "test_accuracy", "samples_per_second", "time_to_accuracy"):
        assert key in summary
    assert set(summary["time_to_accuracy"]) == {"0.9", "0.95"}
    tensors, attrs = read_model(tmp_path / "run" / "model.h5")
    assert attrs["version"] == summary["iterations"][0]
    assert all(np.isfinite(t).all() for t in tensors.values())
    assert "dense1.W" in tensors or len(tensors) >= 4


def test_jobs_files_load():
    from pathlib import Path

    from ebsp_mpi.config import load_job

    jobs = sorted((Path(__file__).parents[1] / "jobs").rglob("*.toml"))
    jobs = [j for j in jobs if "sweeps" not in j.parts and "simulations" not in j.parts]  # sweep files
    assert jobs
    for job in jobs:
        load_job(str(job))


def test_sweep_files_load_and_every_member_validates():
    from pathlib import Path

    from ebsp_mpi.sweep.spec import check_members, load_sweep, resolve_ranks

    sweeps = sorted((Path(__file__).parents[1] / "jobs" / "sweeps").glob("*.toml"))
    assert len(sweeps) >= 3
    for path in sweeps:
        sweep = load_sweep(path)
        assert sweep.members, path
        check_members(sweep, resolve_ranks(sweep, None))


def test_simulation_sweep_files_load_and_every_member_names_its_workers():
    """``jobs/simulations/``: sweeps for ``simulate --sweep``, whose members each set their number of
    virtual workers (no MPI ranks)."""
    from pathlib import Path

    from ebsp_mpi.config import load_job
    from ebsp_mpi.sweep.spec import load_sweep

    sweeps = sorted((Path(__file__).parents[1] / "jobs" / "simulations").glob("*.toml"))
    assert sweeps
    for path in sweeps:
        sweep = load_sweep(path)
        assert sweep.members, path
        for m in sweep.members:
            assert load_job(str(sweep.base) if sweep.base else None, m.overrides).sync.workers >= 1, m.name


def test_cnn_job_on_digits_reaches_95_percent(tmp_path):
    from pathlib import Path

    job = Path(__file__).parents[1] / "jobs" / "digits-cnn.toml"
    p = run("train", str(job), "--out", str(tmp_path / "run"), "--quiet")
    assert p.returncode == 0, p.stderr
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["test_accuracy"] >= 0.95


def test_importing_the_cli_loads_no_analysis_library():
    """``train`` must run without the analysis extra: the analysis subcommands import pandas,
    matplotlib and h5py only when they run, not when the parser is built."""
    code = ("import sys; from ebsp_mpi import cli; cli._parser(); "
            "print(sorted(m for m in ('pandas', 'matplotlib', 'h5py') if m in sys.modules))")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    assert p.stdout.strip() == "[]"


def test_parsing_train_builds_no_other_commands_parser():
    """Every rank of an MPI job parses ``train``: the other commands' parsers, and the modules they
    import, are left out of its start-up; the full parser still has them all."""
    code = ("import sys; from ebsp_mpi import cli; p = cli._parser('train'); a = p.parse_args(['train', '-q']); "
            "print(a.run.__name__, sorted(m for m in ('ebsp_mpi.sweep', 'ebsp_mpi.bench.cli', 'ebsp_mpi.sim.cli', "
            "'ebsp_mpi.plan_cli', 'ebsp_mpi.analysis.cli') if m in sys.modules))")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    assert p.stdout.strip() == "_train []"


def test_help_lists_every_subcommand():
    from ebsp_mpi import cli

    p = run("--help")
    assert p.returncode == 0
    # a subcommand's line is indented by four spaces; wrapped help text by more
    listed = [m.group(1) for line in p.stdout.splitlines() if (m := re.match(r" {4}(\w+)", line))]
    commands = ["train", "config", "sweep", "bench", "simulate", "profile", "plan", "report", "compare", "timeline"]
    assert listed == commands
    assert "{" + ",".join(commands) + "}" in cli.__doc__.splitlines()[0]


def test_help_names_every_sync_model_of_the_registry():
    """The top-level help says which sync models a job may name: all of them, PSP too."""
    from ebsp_mpi.sync.registry import POLICIES

    p = run("--help")
    assert p.returncode == 0
    missing = [m for m in POLICIES if not re.search(rf"\b{m}\b", p.stdout, flags=re.IGNORECASE)]
    assert missing == [], p.stdout


def _help_texts(capsys):
    """Every command's ``--help``, and every benchmark kind's, as a user sees it."""
    import importlib

    from ebsp_mpi import cli
    from ebsp_mpi.bench import KINDS

    parser = cli._parser()
    commands = next(a for a in parser._actions if a.__class__.__name__ == "_SubParsersAction").choices
    texts = {"": parser.format_help()} | {name: p.format_help() for name, p in commands.items()}
    for name, kind in KINDS.items():
        with pytest.raises(SystemExit):
            importlib.import_module(kind.module).main(["--help"])
        texts[f"bench {name}"] = capsys.readouterr().out
    return texts


def test_help_texts_show_no_restructuredtext_marks(capsys):
    """Help that comes from a docstring reads as plain text: no ``literal``, :role:`x` or ``::``."""
    texts = _help_texts(capsys)
    assert len(texts) > 15 and all(texts.values())
    marked = {name: line for name, text in texts.items() for line in text.splitlines()
              if "``" in line or re.search(r":[a-z]+:`", line) or line.rstrip().endswith("::")}
    assert marked == {}
