"""``simulate``: what it refuses leaves nothing behind, and a diverging ``simulate --train`` ends as the
live run does (docs/reliability.md, "Refusals leave nothing behind" and "Emulation fails like the live
run"): exit 2 in one line before any run directory is made (or with what it made removed), exit 1 in
one line for a run that trained to its end and diverged, and a sweep that checks every member first."""

import json
import resource
import subprocess
import sys

import pytest

from cliutil import one_line_error
from ebsp_mpi.cli import main
from ebsp_mpi.data import memory

SMALL = ["--workers", "4", "--set", "sync.model=asp", "-q"]


def run(*args, timeout=60, limit_as=None):
    def limit():
        resource.setrlimit(resource.RLIMIT_AS, (limit_as, limit_as))

    return subprocess.run([sys.executable, "-m", "ebsp_mpi", *args], capture_output=True, text=True,
                          timeout=timeout, preexec_fn=limit if limit_as else None)


def run_sweep_cli(tmp_path, text: str):
    """``simulate --sweep FILE --train`` of a sweep file holding `text`, into ``tmp_path/out``."""
    sweep = tmp_path / "s.toml"
    sweep.write_text(text)
    return run("simulate", "--sweep", str(sweep), "--train", "--out", str(tmp_path / "out"), "-q", timeout=120)


def test_a_replay_with_real_weights_past_its_recording_is_refused_and_leaves_no_run(tmp_path, capsys):
    assert main(["simulate", "--train", "--iterations", "10", "--out", str(tmp_path / "rec"), *SMALL]) == 0
    capsys.readouterr()
    line = one_line_error(capsys, ["simulate", "--replay", str(tmp_path / "rec"), "--train", "--iterations", "20",
                                   "--out", str(tmp_path / "out"), "-q"])
    assert "the recording ends" in line and "--iterations" in line, line
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("limit", [["--iterations", "5"], ["--set", "stop.seconds=0.005"]])
def test_a_replay_with_real_weights_cut_short_by_its_own_limit_runs(tmp_path, capsys, limit):
    """The user's own limit below the recording's: the replay stops there (it said the recording
    "cannot be paired": the recorded pushes of a worker the limit had stopped came on)."""
    assert main(["simulate", "--train", "--iterations", "10", "--out", str(tmp_path / "rec"), *SMALL]) == 0
    assert main(["simulate", "--replay", str(tmp_path / "rec"), "--train", *limit, "--out", str(tmp_path / "out"),
                 "-q"]) == 0
    capsys.readouterr()
    done = json.loads((tmp_path / "out" / "summary.json").read_text())["iterations"]
    assert 0 < max(done) <= 5 if limit[0] == "--iterations" else 0 < max(done) < 10, done


def test_a_replay_with_real_weights_past_its_recorded_seconds_is_refused(tmp_path, capsys):
    assert main(["simulate", "--train", "--set", "stop.seconds=0.05", "--set", "stop.iterations=0",
                 "--out", str(tmp_path / "rec"), *SMALL]) == 0
    capsys.readouterr()
    line = one_line_error(capsys, ["simulate", "--replay", str(tmp_path / "rec"), "--train", "--set",
                                   "stop.seconds=0.2", "--out", str(tmp_path / "out"), "-q"])
    assert "the recording ends" in line, line
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("overrides", [
    ["optim.lr=1e6"],
    ["optim.staleness=dc", "optim.dc_lambda=1e30", "optim.lr=0.5"],
])
def test_a_diverging_emulation_exits_1_in_one_line_as_the_live_run_does(tmp_path, overrides):
    sets = [a for o in overrides for a in ("--set", o)]
    p = run("simulate", "--train", "--iterations", "30", "--out", str(tmp_path / "out"), *SMALL, *sets)
    assert p.returncode == 1, p.stdout + p.stderr
    # one error line at the end; before it, at most the one warning that the live run also gives the
    # moment an evaluation sees the loss is not finite (no NumPy warnings, no traceback)
    *before, last = p.stderr.strip().splitlines()
    assert last.startswith("ebsp_mpi: error:") and "diverged" in last, p.stderr
    assert len(before) <= 1 and all("ebsp_mpi.divergence: training diverged:" in line for line in before), p.stderr
    assert (tmp_path / "out" / "summary.json").is_file()  # the run ran to its end: its files stay, as live


def test_a_dc_corrected_step_that_is_not_finite_is_never_applied(tmp_path):
    from ebsp_mpi.config import load_job
    from ebsp_mpi.outputs import read_model
    from ebsp_mpi.sim.run import simulate_job

    job = load_job(None, ["sync.model=asp", "optim.staleness=dc", "optim.dc_lambda=1e30",
                          "straggler.slowdown=[1, 1, 1, 3]"])
    summary = simulate_job(job, 4, tmp_path / "run", iterations=20, show_progress=False, train=True)
    tensors, _ = read_model(tmp_path / "run" / "model.h5")
    assert all(bool((abs(t) < float("inf")).all()) for t in tensors.values())
    assert summary["rejected_pushes"] > 0


def test_evaluations_between_two_steps_evaluate_the_weights_once(tmp_path, monkeypatch):
    """``eval.every_seconds = 1e-5``: thousands of evaluations, every one recorded, but weights that no
    step has changed are not evaluated again (the issue's 1e-6 ran 200,000 evaluations for > 60 s)."""
    from ebsp_mpi.config import load_job
    from ebsp_mpi.sim import training
    from ebsp_mpi.sim.run import simulate_job

    calls = []
    init = training.EmulatedTrainer.__init__

    def counting(self, *args, **kwargs):
        init(self, *args, **kwargs)
        evaluate = self.model.evaluate
        self.model.evaluate = lambda *a, **k: calls.append(1) or evaluate(*a, **k)

    monkeypatch.setattr(training.EmulatedTrainer, "__init__", counting)
    job = load_job(None, ["sync.model=asp", "eval.every_seconds=1e-5"])
    summary = simulate_job(job, 4, tmp_path / "run", iterations=30, show_progress=False, train=True)
    assert len(summary["evals"]) > 20_000
    assert len(calls) <= summary["versions"] + 1
    assert summary["test_accuracy"] == summary["evals"][-1]["test_acc"]


@pytest.mark.parametrize("every", ["1e-9", "1e-320"])
def test_evaluations_past_the_bound_are_refused_in_one_line(tmp_path, capsys, every):
    line = one_line_error(capsys, ["simulate", "--train", "--iterations", "50", "--set", f"eval.every_seconds={every}",
                                   "--out", str(tmp_path / "out"), *SMALL])
    assert "eval.every_seconds" in line, line
    assert not (tmp_path / "out").exists()


def test_more_workers_than_the_memory_holds_are_refused_before_the_run_directory(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(memory, "physical_memory", lambda: 64 << 20)
    line = one_line_error(capsys, ["simulate", "--workers", "1000000", "--iterations", "2",
                                   "--out", str(tmp_path / "out"), "-q"])
    assert "1000000 workers" in line and "64.0 MiB" in line, line
    assert not (tmp_path / "out").exists()


def test_ten_million_workers_under_ulimit_v_are_one_line(tmp_path):
    p = run("simulate", "--workers", "10000000", "--iterations", "2", "--out", str(tmp_path / "out"), "-q",
            limit_as=6_000_000 * 1024, timeout=120)
    assert p.returncode == 2, p.stderr[-2000:]
    err = p.stderr.strip().splitlines()
    assert len(err) == 1 and "address-space limit" in err[0], p.stderr[-2000:]
    assert not (tmp_path / "out").exists()


def test_a_sweep_checks_every_member_before_the_first_runs(tmp_path):
    p = run_sweep_cli(tmp_path, 'name = "s"\nset = ["trace.enabled=false", "stop.iterations=5", "sync.model=asp"]\n'
                      '[[member]]\nname = "a"\nset = ["sync.workers=2"]\n'
                      '[[member]]\nname = "b"\nset = ["sync.workers=4"]\n'
                      '[[member]]\nname = "c"\nset = ["sync.workers=4", "data.batch_size=100000"]\n')
    assert p.returncode == 2, p.stderr
    err = p.stderr.strip().splitlines()
    assert len(err) == 1 and "member 'c'" in err[0] and "batch_size" in err[0], p.stderr
    assert not (tmp_path / "out").exists()


def test_a_sweep_marks_a_diverged_member_in_its_table_and_exits_1(tmp_path):
    pytest.importorskip("matplotlib")
    p = run_sweep_cli(tmp_path, 'name = "s"\nset = ["trace.enabled=false", "stop.iterations=20", "sync.model=asp", '
                      '"sync.workers=2"]\n'
                      '[[member]]\nname = "fine"\nset = []\n'
                      '[[member]]\nname = "wild"\nset = ["optim.lr=1e6"]\n')
    assert p.returncode == 1, p.stderr
    *before, last = p.stderr.strip().splitlines()  # the error last, after at most the member's warning
    assert "wild" in last and len(before) <= 1, p.stderr
    assert all("ebsp_mpi.divergence: training diverged:" in line for line in before), p.stderr
    table = (tmp_path / "out" / "scaling.md").read_text()
    assert "diverged" in table and table.count("| ok |") == 1, table
    manifest = json.loads((tmp_path / "out" / "sweep.json").read_text())
    assert [m["status"] for m in manifest["members"]] == ["ok", "failed"]


def test_running_out_of_memory_past_the_estimate_is_one_line_and_leaves_no_run(tmp_path, capsys, monkeypatch):
    from ebsp_mpi.sim import run as sim_run

    def short_of_memory(job, workers, run_dir, **kwargs):
        (run_dir / "trace").mkdir()
        (run_dir / "trace" / "rank-0000.h5").write_bytes(b"half")
        raise MemoryError

    monkeypatch.setattr(sim_run, "simulate_job", short_of_memory)
    line = one_line_error(capsys, ["simulate", "--workers", "4", "--iterations", "2", "--out", str(tmp_path / "out"),
                                   "-q"])
    assert "ran out of memory" in line, line
    assert not (tmp_path / "out").exists()


def test_a_sweep_refuses_a_members_evaluations_past_the_bound_before_the_first_runs(tmp_path):
    p = run_sweep_cli(tmp_path, 'name = "s"\nset = ["trace.enabled=false", "stop.iterations=0", "stop.epochs=0", '
                      '"stop.seconds=0.2", "sync.model=asp", "sync.workers=2"]\n'
                      '[[member]]\nname = "a"\nset = []\n'
                      '[[member]]\nname = "b"\nset = ["eval.every_seconds=1e-7"]\n')
    assert p.returncode == 2, p.stderr
    err = p.stderr.strip().splitlines()
    assert len(err) == 1 and "member 'b'" in err[0] and "eval.every_seconds" in err[0], p.stderr
    assert not (tmp_path / "out").exists()


def test_a_sweep_member_refused_only_as_it_runs_undoes_the_whole_sweep(tmp_path):
    """Stopped by iterations, a member's evaluations are counted as it runs: its refusal removes what
    the sweep made, the members that ran before it included."""
    p = run_sweep_cli(tmp_path, 'name = "s"\nset = ["trace.enabled=false", "stop.iterations=20", "sync.model=asp", '
                      '"sync.workers=2"]\n'
                      '[[member]]\nname = "a"\nset = []\n'
                      '[[member]]\nname = "b"\nset = ["eval.every_seconds=1e-7"]\n')
    assert p.returncode == 2, p.stderr
    err = p.stderr.strip().splitlines()
    assert len(err) == 1 and "member 'b'" in err[0] and "eval.every_seconds" in err[0], p.stderr
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("how", ["job", "env"])
def test_an_emulation_asked_to_compute_on_cupy_is_refused_in_one_line(tmp_path, capsys, monkeypatch, how):
    """train refuses a CuPy it cannot have; the emulation, which computes on NumPy whatever the job
    says, ran on NumPy without a word."""
    args = ["simulate", "--train", "--workers", "2", "--iterations", "3", "--out", str(tmp_path / "run")]
    if how == "job":
        args += ["--set", "backend=cupy"]
    else:
        monkeypatch.setenv("EBSP_BACKEND", "cupy")
    source = "backend" if how == "job" else "EBSP_BACKEND"
    assert f"simulate --train: {source} = 'cupy', but the emulation computes on NumPy only" in \
        one_line_error(capsys, args)
    assert not (tmp_path / "run").exists()


def test_a_replay_of_a_run_made_without_traces_says_so(tmp_path, capsys):
    """A finished run (its summary) with trace.enabled = false was called "not a run directory"."""
    run = tmp_path / "untraced"
    run.mkdir()
    from ebsp_mpi.config import load_job, to_dict

    config = to_dict(load_job(None, ["trace.enabled=false", "sync.workers=2", "stop.iterations=20", "stop.epochs=0"]))
    (run / "summary.json").write_text(json.dumps({"sync": "bsp", "workers": 2, "config": config}))
    line = one_line_error(capsys, ["simulate", "--replay", str(run), "--out", str(tmp_path / "sim")])
    assert "this run wrote no traces (trace.enabled = false)" in line, line
    assert not (tmp_path / "sim").exists()
