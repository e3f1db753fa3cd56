"""``simulate --train``: the simulated schedule with real weights (ebsp_mpi.sim.training).

Pure tests drive the emulation in process; the replay tests train live under mpiexec (4 workers, one
three times slower, 100 iterations) and replay the run with real weights: under the run's own sync
model the pushes are taken in the server's order, every gradient on the version it was computed on
live, so the replay's ``model.h5`` equals the live one up to float summation order. The control, a
replay under another model, must differ.
"""

import json
import subprocess
import sys

import numpy as np
import pytest

from ebsp_mpi.config import load_job
from ebsp_mpi.errors import UsageError
from ebsp_mpi.outputs import read_model
from ebsp_mpi.sim import run as sim_run
from ebsp_mpi.sim.run import simulate_job
from ebsp_mpi.trace.reader import read_run
from mpirun import child_env, max_abs_difference, train

STRAGGLER = ["straggler.slowdown=[1, 1, 1, 3]"]
LIVE = ["stop.iterations=100", "stop.epochs=0", *STRAGGLER]
MODELS = {"bsp": [], "asp": [], "ssp": ["sync.staleness=2"], "dssp": [], "elasticbsp": [], "psp": []}
#: float32 models trained on the same pushes in the same order, summed in the same order: equal, but for
#: the row blocks a live worker with wait-free backprop computes its gradient in
TOLERANCE = 1e-5


def emulate(tmp_path, *overrides, workers=4, iterations=60):
    job = load_job(None, ["eval.every_seconds=0.2", *STRAGGLER, *overrides])
    return simulate_job(job, workers, tmp_path / "run", iterations=iterations, show_progress=False, train=True)


def test_an_emulated_run_trains_and_reports_like_a_live_one(tmp_path):
    summary = emulate(tmp_path, "sync.model=asp")
    assert summary["test_accuracy"] > 0.8 and summary["test_loss"] > 0
    assert summary["iterations"] == [60] * 4 and summary["versions"] == 240
    assert len(summary["evals"]) >= 5  # every 0.2 virtual s of the slowest worker's 1.8 s, and the end
    times = [e["t"] for e in summary["evals"]] if isinstance(summary["evals"][0], dict) else \
        [e[0] for e in summary["evals"]]
    assert times == sorted(times)
    evals = read_run(tmp_path / "run")[0].table("evals")  # the server's trace holds them, as live
    assert evals["t"].tolist() == times and evals["test_acc"][-1] == summary["test_accuracy"]
    tensors, attrs = read_model(tmp_path / "run" / "model.h5")
    assert attrs["version"] == 240 and tensors
    training = summary["simulation"]["training"]
    assert training["gradients"] == 240
    assert 1 <= training["peak_versions"] <= 4  # a worker's pulled version is copied when a step passes it


def test_bsp_holds_no_copy_of_any_version(tmp_path):
    summary = emulate(tmp_path, "sync.model=bsp")
    assert summary["versions"] == 60 and summary["simulation"]["training"]["peak_versions"] == 0


def test_the_staleness_rules_change_what_a_stale_push_does_and_not_bsp(tmp_path):
    runs = {}
    for rule in ("none", "scale", "dc"):
        emulate(tmp_path / rule, "sync.model=asp", f"optim.staleness={rule}", "optim.dc_lambda=2.0")
        runs[rule] = read_model(tmp_path / rule / "run" / "model.h5")[0]
    for rule in ("scale", "dc"):
        assert max(float(np.abs(runs[rule][k] - runs["none"][k]).max()) for k in runs["none"]) > 1e-4, rule
    bsp = {}
    for rule in ("none", "dc"):
        emulate(tmp_path / f"bsp-{rule}", "sync.model=bsp", f"optim.staleness={rule}")
        bsp[rule] = read_model(tmp_path / f"bsp-{rule}" / "run" / "model.h5")[0]
    assert all(np.array_equal(bsp["none"][k], bsp["dc"][k]) for k in bsp["none"])  # a round is never stale


@pytest.mark.parametrize("override, says", [
    ("osdp.plan=plan.json", "an OSDP plan"),
    ("comm.hybrid=sfb", "comm.hybrid = 'sfb'"),
])
def test_what_it_cannot_emulate_is_one_line(tmp_path, override, says):
    with pytest.raises(UsageError, match=says):
        emulate(tmp_path, override)


def test_a_resumed_run_is_refused_with_real_weights(tmp_path, monkeypatch):
    class Resumed:
        source, recorded, restarts = "replay of a resumed run", 4, [object()]

    monkeypatch.setattr(sim_run, "virtual_workers", lambda job, workers, replay: Resumed())
    with pytest.raises(UsageError, match="resumed 1 time"):
        emulate(tmp_path, "sync.model=asp")


# -- against live runs ---------------------------------------------------------------------------------


def replay(live, out, *overrides):
    cmd = [sys.executable, "-m", "ebsp_mpi", "simulate", "--replay", str(live), "--train", "--out", str(out), "-q"]
    for o in overrides:
        cmd += ["--set", o]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=180, env=child_env())
    assert p.returncode == 0, p.stdout + p.stderr
    return json.loads((out / "summary.json").read_text())


@pytest.mark.timeout(400)
@pytest.mark.parametrize("model", MODELS)
def test_a_replay_with_real_weights_reproduces_the_live_model(model, tmp_path):
    live = tmp_path / "live"
    overrides = [f"sync.model={model}", *MODELS[model], *LIVE]
    p = train(5, live, *overrides, timeout=240)
    assert p.returncode == 0, p.stderr
    summary = replay(live, tmp_path / "replay")
    assert summary["simulation"]["exact_replay"] is True
    assert max_abs_difference(live, tmp_path / "replay") <= TOLERANCE
    # the control: under another model the recorded order does not fit, the recorded times are replayed
    other = "asp" if model != "asp" else "bsp"
    control = replay(live, tmp_path / "control", f"sync.model={other}")
    assert control["simulation"]["exact_replay"] is False
    a, _ = read_model(live / "model.h5")
    b, _ = read_model(tmp_path / "control" / "model.h5")
    assert max(float(np.abs(a[k] - b[k]).max()) for k in a) > 1e-3


@pytest.mark.timeout(400)
def test_a_run_with_two_servers_and_wait_free_backprop_replays_too(tmp_path):
    live = tmp_path / "live"
    p = train(6, live, "sync.model=ssp", "runtime.servers=2", "runtime.wait_free_backprop=true", *LIVE,
              timeout=240)
    assert p.returncode == 0, p.stderr
    assert replay(live, tmp_path / "replay")["simulation"]["exact_replay"] is True
    assert max_abs_difference(live, tmp_path / "replay") <= TOLERANCE


def test_a_sweep_with_real_weights_writes_the_accuracy_table_and_figure(tmp_path):
    pytest.importorskip("matplotlib")
    from ebsp_mpi.sim.accuracy import accuracy_rows
    from ebsp_mpi.sim.study import run_sweep

    sweep = tmp_path / "sweep.toml"
    sweep.write_text('name = "acc"\nset = ["trace.enabled=false", "stop.iterations=0", "stop.epochs=0", '
                     '"stop.seconds=1.5", "straggler.base_s=0.01", "eval.every_seconds=0.1", '
                     '"eval.targets=[0.5, 0.999]"]\n'
                     '[[member]]\nname = "bsp"\nset = ["sync.model=bsp", "sync.workers=4"]\n'
                     '[[member]]\nname = "asp-dc"\nset = ["sync.model=asp", "optim.staleness=dc", "sync.workers=4"]\n'
                     '[[member]]\nname = "asp-dc-slow"\nset = ["sync.model=asp", "optim.staleness=dc", '
                     '"sync.workers=4", "optim.lr=0.01"]\n')
    out = run_sweep(str(sweep), str(tmp_path / "out"), show_progress=False, train=True)
    for name in ("accuracy.md", "accuracy.csv", "accuracy.png"):
        assert (out / name).stat().st_size > 0
    bsp, asp, asp_slow = accuracy_rows(out)
    assert (bsp["model"], asp["model"], asp_slow["model"]) == ("bsp", "asp+dc", "asp+dc")
    # two members of one model and worker count are told apart by their names, in the table and the figure
    assert (bsp["line"], asp["line"], asp_slow["line"]) == ("bsp", "asp-dc", "asp-dc-slow")
    table = (out / "accuracy.md").read_text()
    assert "| asp-dc | asp+dc | 4 |" in table and "| asp-dc-slow | asp+dc | 4 |" in table
    assert bsp["t_0.5"] > 0 and bsp["t_0.5_vs_bsp"] == 1.0
    assert np.isnan(bsp["t_0.999"]) and np.isnan(asp["t_0.999_vs_bsp"])  # never reached
    assert len(bsp["evals"]) >= 15 and 0 < bsp["test_accuracy"] <= 1
    assert "| bsp | bsp | 4 |" in table


def test_a_sweep_over_seeds_weighs_each_seed_against_bsp_on_the_same_seed(tmp_path):
    """Each seed's member is one look of its model's line, and its time to a target is set against
    BSP's on its own seed: against another seed's, the ratio would mix the seeds' straggler draws."""
    from ebsp_mpi.sim.accuracy import accuracy_rows
    from ebsp_mpi.sim.study import run_sweep

    sweep = tmp_path / "sweep.toml"
    sweep.write_text('name = "acc"\nseeds = [0, 1]\nset = ["trace.enabled=false", "stop.iterations=0", '
                     '"stop.epochs=0", "stop.seconds=1.5", "straggler.base_s=0.01", "straggler.spread=4", '
                     '"eval.every_seconds=0.1", "eval.targets=[0.5]"]\n'
                     '[[member]]\nname = "bsp"\nset = ["sync.model=bsp", "sync.workers=4"]\n'
                     '[[member]]\nname = "asp"\nset = ["sync.model=asp", "sync.workers=4"]\n')
    out = run_sweep(str(sweep), str(tmp_path / "out"), show_progress=False, train=True)
    rows = {r["member"]: r for r in accuracy_rows(out)}
    assert sorted(rows) == ["asp-seed0", "asp-seed1", "bsp-seed0", "bsp-seed1"]
    assert [rows[m]["line"] for m in ("bsp-seed0", "bsp-seed1", "asp-seed0", "asp-seed1")] == \
        ["bsp", "bsp", "asp", "asp"]
    assert rows["bsp-seed0"]["t_0.5"] != rows["bsp-seed1"]["t_0.5"]  # the seeds differ, or nothing is tested
    for seed in (0, 1):
        asp, bsp = rows[f"asp-seed{seed}"], rows[f"bsp-seed{seed}"]
        assert asp["seed"] == bsp["seed"] == seed
        assert bsp["t_0.5_vs_bsp"] == 1.0
        assert asp["t_0.5_vs_bsp"] == pytest.approx(asp["t_0.5"] / bsp["t_0.5"])
    assert "| asp-seed1 | asp | 4 |" in (out / "accuracy.md").read_text()


@pytest.mark.timeout(400)
@pytest.mark.parametrize("rule", ["scale", "dc"])
def test_the_servers_staleness_rules_are_the_emulations(rule, tmp_path):
    """Live ASP with two servers under a staleness rule; its exact replay applies the same rule to the
    same pushes. The control, the same pushes under no rule, differs."""
    live = tmp_path / "live"
    rules = [f"optim.staleness={rule}", "optim.dc_lambda=2.0"]
    p = train(6, live, "sync.model=asp", "runtime.servers=2", *rules, *LIVE, timeout=240)
    assert p.returncode == 0, p.stderr
    assert replay(live, tmp_path / "replay")["simulation"]["exact_replay"] is True
    assert max_abs_difference(live, tmp_path / "replay") <= TOLERANCE
    # the recorded order, under another rule: not an exact replay, and the summary says why
    control = replay(live, tmp_path / "none", "optim.staleness=none")["simulation"]
    assert control["recorded_order"] is True and control["exact_replay"] is False
    assert control["exact_replay_reason"] == "the job differs from the recorded one in optim.staleness"
    assert max_abs_difference(live, tmp_path / "none") > 1e-3
