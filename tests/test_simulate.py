"""``python -m ebsp_mpi simulate``: the run directory it writes (train's schema, read by the analysis),
the virtual workers (the straggler model's draws, replays), the simulator's versions and staleness, the
speed-ups of the policies against scans of every worker, and bad input as one line with exit code 2.

The agreement of a replay with the live run it replays is tests/test_simulate_live.py (MPI, slow)."""

import json
import subprocess
import sys

import numpy as np
import pytest

from ebsp_mpi.config import SyncConfig, load_job, to_dict
from ebsp_mpi.outputs import SUMMARY_KEYS
from ebsp_mpi.sim.restarts import Cuts
from ebsp_mpi.sim.run import _iteration_table, _pull_rows
from ebsp_mpi.sim.workers import JITTER_BLOCK, NOMINAL_BASE_S, ModelWorkers, Parts
from ebsp_mpi.straggler import SlowPhase, StragglerModel, straggler_model
from ebsp_mpi.sync.bsp import BSP
from ebsp_mpi.sync.dssp import DSSP
from ebsp_mpi.sync.registry import make_policy
from ebsp_mpi.sim.events import simulate
from ebsp_mpi.sync.ssp import SSP
from ebsp_mpi.trace.reader import read_run
from ebsp_mpi.trace.schema import ITERATIONS, PULLS

STRAGGLER = ["straggler.base_s=0.01", "straggler.slowdown=[1, 1, 3]", "straggler.jitter_sigma=0.2"]


def run(*args, timeout=120):
    return subprocess.run([sys.executable, "-m", "ebsp_mpi", *args], capture_output=True, text=True,
                          timeout=timeout)


def simulate_cli(out, *args, timeout=120):
    return run("simulate", "--out", str(out), "-q", *args, timeout=timeout)


def random_intervals(n: int, seed: int, columns: int = 64) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return np.exp(rng.uniform(0, np.log(5.0), n))[:, None] * rng.lognormal(0.0, 0.3, (n, columns))


# -- the event loop ------------------------------------------------------------------------------------


def test_versions_and_staleness_are_counted_as_the_server_counts_them():
    """ASP: every push is a version, so a push's staleness is the pushes of others since its pull; BSP:
    a round is a version, so every push is of the current round (staleness 0)."""
    res = simulate(make_policy(SyncConfig(model="asp"), 2), [1.0, 2.5], 4)
    # worker 1 pulls at 0 (version 0), pushes at 2.5 after worker 0's pushes at 1 and 2: staleness 2
    assert res.used[1].tolist() == [0, 3, 6, 7] and res.before[1][0] == 2  # pushes at 1, 2 by worker 0
    bsp = simulate(BSP(3), [1.0, 2.0, 3.0], 5)
    assert all((b - u == 0).all() for b, u in zip(bsp.before, bsp.used, strict=True))
    # workers 0 and 1 are told to stop at their last push, before worker 2's completes the last round
    assert bsp.versions == 5 and bsp.stop_version.tolist() == [4, 4, 5]


def test_a_time_limit_stops_each_worker_at_its_first_release_after_it():
    res = simulate(SSP(2, staleness=0), [1.0, 3.0], until=10.0)
    assert [len(p) for p in res.push] == [4, 4]  # lockstep: both released at 3, 6, 9, stopped at 12
    assert res.end.tolist() == [12.0, 12.0] and res.wait[0] == pytest.approx(4 * 2.0)
    with pytest.raises(ValueError, match="iteration count or a finite time limit"):
        simulate(SSP(2), [1.0, 1.0])


@pytest.mark.parametrize("seed", range(4))
def test_the_policies_sped_up_release_as_a_scan_of_every_worker_does(seed):
    """SSP's held workers filed by the minimum that frees them, and DSSP's heap of the slowest workers'
    predicted pushes, against the definitions: each release's leads within the bounds, and DSSP with
    r = 0 releasing exactly as SSP."""
    n, s = 9, 1 + seed % 3
    intervals = random_intervals(n, seed)
    ssp = simulate(SSP(n, staleness=s), intervals, 60)
    assert all(max(r.leads()) <= s for r in ssp.releases[1:])
    dssp = simulate(DSSP(n, staleness=s, dssp_range=0), intervals, 60)
    assert [(r.t, r.workers) for r in dssp.releases] == [(r.t, r.workers) for r in ssp.releases]
    wide = simulate(DSSP(n, staleness=s, dssp_range=3), intervals, 60)
    assert all(max(r.leads()) <= s + 3 for r in wide.releases[1:])


# -- virtual workers -----------------------------------------------------------------------------------


def test_model_workers_draw_the_live_workers_jitter_and_slow_phases():
    model = StragglerModel(3, slowdown=[1.0, 2.0], jitter_sigma=0.3, base_s=0.01, seed=5,
                           phases=[SlowPhase(1, 2.0, 3.0, 4.0)])
    workers = ModelWorkers(model)
    for w, k, t in [(0, 0, 0.0), (1, 7, 2.5), (1, 7, 3.5), (2, JITTER_BLOCK + 3, 9.0)]:
        assert workers.interval(w, k, t) == pytest.approx(model.emulated(w, k, 0.0, t), rel=1e-12)


def test_the_spread_is_log_uniform_per_worker_and_the_same_for_any_number_of_workers():
    few, many = StragglerModel(4, spread=4.0, seed=1), StragglerModel(4096, spread=4.0, seed=1)
    assert few.slowdown == many.slowdown[:4]
    factors = np.log(np.array(many.slowdown)) / np.log(4.0)
    assert factors.min() >= 0 and factors.max() < 1 and abs(factors.mean() - 0.5) < 0.03


# -- the run directory ----------------------------------------------------------------------------------


@pytest.mark.parametrize("model", ["bsp", "ssp", "elasticbsp", "psp"])
def test_a_simulated_run_has_trains_summary_keys_and_trace_tables(tmp_path, model):
    p = simulate_cli(tmp_path / "sim", "--workers", "3", "--iterations", "40", "--set", f"sync.model={model}",
                     *[a for s in STRAGGLER for a in ("--set", s)])
    assert p.returncode == 0, p.stderr
    summary = json.loads((tmp_path / "sim" / "summary.json").read_text())
    assert list(summary)[:len(SUMMARY_KEYS)] == list(SUMMARY_KEYS) and list(summary)[-1] == "simulation"
    assert summary["backend"] == "simulated" and summary["test_accuracy"] is None
    assert summary["iterations"] == [40, 40, 40] and summary["sync"] == model
    traces = read_run(tmp_path / "sim")
    assert sorted(traces) == [0, 1, 2, 3] and all(t.attrs["simulated"] for t in traces.values())
    pushes, pulls = traces[0].table("pushes"), traces[0].table("pulls")
    assert len(pushes) == 120 and len(pulls) == 3 * 41 and np.all(np.diff(pushes["t"]) >= 0)
    it = traces[3].table("iterations")
    # worker 2 is three times slower; the trace's waits add up to the summary's
    assert np.allclose(it["t_compute_end"] - it["t_start"], it["injected_delay_s"])
    assert it["wait_s"].sum() == pytest.approx(summary["wait_seconds"][2])
    if model == "bsp":
        assert (pushes["staleness"] == 0).all() and summary["versions"] == 40
    if model == "elasticbsp":
        assert len(traces[0].table("zipline")) >= summary["barriers"] > 0


def _pulls_of(result, w):
    """Worker `w`'s ``pulls`` rows, one worker at a time: the oracle of the table built whole."""
    start, push = result.start[w], result.push[w]
    rows = np.zeros(len(start) + 1, dtype=PULLS)
    rows["worker"] = w
    rows["t_request"] = np.concatenate([[start[0] if len(start) else result.end[w]], push])
    rows["t_reply"] = np.append(start, result.end[w])
    rows["version"] = np.append(result.used[w], result.stop_version[w])
    return rows


def _iterations_of(result, w, parts, cut, recorded_waits):
    """Worker `w`'s ``iterations`` rows, one worker at a time (see :func:`_pulls_of`)."""
    start, k = result.start[w], len(result.start[w])
    rows = np.zeros(k, dtype=ITERATIONS)
    rows["iteration"] = np.arange(k)
    rows["t_start"] = start + parts.down[:k]
    rows["t_compute_end"] = rows["t_start"] + parts.compute[:k] + parts.delay[:k]
    rows["t_push"] = rows["t_compute_end"] + parts.push[:k]
    replies = np.append(start[1:], result.end[w])
    for i, t in cut.items():
        replies[i] = t
    ends = replies + parts.down[1:k + 1]
    for i, wait in recorded_waits.items():
        ends[i] = rows["t_push"][i] + wait
    rows["t_end"] = np.maximum(ends, rows["t_push"])
    rows["wait_s"] = rows["t_end"] - rows["t_push"]
    rows["version"] = result.used[w]
    rows["loss"] = rows["epoch"] = np.nan
    rows["injected_delay_s"] = parts.delay[:k]
    return rows


@pytest.mark.parametrize("model", ["bsp", "asp", "ssp"])
@pytest.mark.parametrize("t0", [0.0, 2.0])  # 2.0: past the time limit, so no worker starts
def test_the_trace_tables_built_for_all_workers_at_once_equal_one_worker_at_a_time(model, t0):
    """Workers of uneven iteration counts (a time limit), phases of their own, iterations a restart
    cut short: every worker's block of ``pulls`` and ``iterations`` is its own rows."""
    rng = np.random.default_rng(3)
    result = simulate(make_policy(SyncConfig(model=model), 5, seed=0), rng.uniform(0.01, 0.1, size=(5, 7)),
                      until=1.0, t0=t0)
    counts = [len(s) for s in result.start]
    if t0:
        assert counts == [0] * 5
    elif model != "bsp":  # BSP's rounds keep the counts equal
        assert len(set(counts)) > 1, counts
    parts = [Parts(*(rng.uniform(0, 0.01, k + 1) for _ in range(5))) for k in counts]
    cuts = Cuts.none(5)
    if counts[2] > 3:
        cuts.replies[2][1] = float(result.start[2][2]) - 0.001
    if counts[3] > 3:  # a wait as recorded: no transit added to it
        cuts.waits[3][2] = 0.0004
    table, first = _iteration_table(result, parts, cuts)
    assert first.tolist() == np.concatenate([[0], np.cumsum(counts)]).tolist()
    for w in range(5):
        own = _iterations_of(result, w, parts[w], cuts.replies[w], cuts.waits[w])
        assert table[first[w]:first[w + 1]].tobytes() == own.tobytes(), w
    whole = np.concatenate([_pulls_of(result, w) for w in range(5)])
    assert _pull_rows(result).tobytes() == whole[np.lexsort((whole["worker"], whole["t_reply"]))].tobytes()


@pytest.mark.slow
def test_report_compare_and_timeline_read_a_simulated_run(tmp_path):
    assert simulate_cli(tmp_path / "sim", "--workers", "40", "--iterations", "30", "--set", "sync.model=elasticbsp",
                        "--set", "straggler.base_s=0.01", "--set", "straggler.spread=4").returncode == 0
    p = run("report", str(tmp_path / "sim"), "--out", str(tmp_path / "report"))
    assert p.returncode == 0, p.stderr
    assert (tmp_path / "report" / "wait.png").is_file() and (tmp_path / "report" / "zipline.png").is_file()
    p = run("timeline", str(tmp_path / "sim"), "-o", str(tmp_path / "t.json"))
    assert p.returncode == 0, p.stderr
    assert json.loads((tmp_path / "t.json").read_text())["otherData"]["world_size"] == 41


def test_a_replay_of_a_simulated_run_repeats_it(tmp_path):
    """A run's recorded times replayed under the same job give the same timeline (the model workers'
    phases are all straggler delay, which the replay takes as it was recorded)."""
    args = ["--workers", "4", "--iterations", "30", "--set", "sync.model=ssp", "--set", "sync.staleness=1",
            *[a for s in STRAGGLER for a in ("--set", s)]]
    assert simulate_cli(tmp_path / "a", *args).returncode == 0
    p = simulate_cli(tmp_path / "b", "--replay", str(tmp_path / "a"))
    assert p.returncode == 0, p.stderr
    a, b = (json.loads((tmp_path / d / "summary.json").read_text()) for d in "ab")
    assert b["workers"] == 4 and b["simulation"]["replay"] == str(tmp_path / "a")
    assert b["wall_seconds"] == pytest.approx(a["wall_seconds"], rel=1e-9)
    assert b["wait_seconds"] == pytest.approx(a["wait_seconds"], rel=1e-9, abs=1e-12)


def test_a_sweep_of_simulations_writes_its_scaling_table(tmp_path):
    sweep = tmp_path / "s.toml"
    sweep.write_text('name = "s"\nset = ["trace.enabled=false", "stop.iterations=20", "straggler.base_s=0.01", '
                     '"straggler.spread=3"]\n' + "".join(
                         f'[[member]]\nname = "{m}-n{n}"\nset = ["sync.model={m}", "sync.workers={n}"]\n'
                         for n in (2, 8) for m in ("asp", "bsp", "elasticbsp")))
    p = run("simulate", "--sweep", str(sweep), "--out", str(tmp_path / "out"), "-q")
    assert p.returncode == 0, p.stderr
    table = (tmp_path / "out" / "scaling.csv").read_text().splitlines()
    assert len(table) == 7 and (tmp_path / "out" / "scaling.png").is_file()
    manifest = json.loads((tmp_path / "out" / "sweep.json").read_text())
    assert [m["status"] for m in manifest["members"]] == ["ok"] * 6
    assert run("compare", str(tmp_path / "out")).returncode == 0


# -- bad input ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("args, message", [
    (["--workers", "0", "--iterations", "5"], "--workers 0: needs at least 1 worker"),
    (["--workers", "2"], "give --iterations K"),
    (["--iterations", "5"], "how many workers"),
    (["--workers", "2", "--iterations", "5", "--set", "straggler.enabled=false"], "straggler.enabled = false"),
    (["--workers", "2", "--iterations", "5", "--set", "straggler.base_s=0.01", "--set", "straggler.slowdown=[1, 2, 3]"],
     "simulate with 2 workers: straggler.slowdown has 3 entries"),
    (["--workers", "2", "--iterations", "5", "--set", "straggler.base_s=0.01", "--set",
      "straggler.phases=[{worker = 5, t1 = 0.0, t2 = 1.0, factor = 2.0}]"], "worker 5 out of range"),
    (["--replay", "{tmp}"], "--replay {tmp}: not a run directory"),
    (["--replay", "{tmp}/nowhere"], "no such directory"),
    (["--sweep", "{tmp}/nowhere.toml"], "nowhere.toml"),
])
def test_bad_input_is_one_line_and_exit_code_2(tmp_path, args, message):
    args = [a.replace("{tmp}", str(tmp_path)) for a in args]
    p = simulate_cli(tmp_path / "out", *args)
    assert p.returncode == 2, p.stderr
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and message.replace("{tmp}", str(tmp_path)) in lines[0], p.stderr
    assert not (tmp_path / "out").exists()  # no empty run directory left behind


def test_a_replay_directory_without_traces_is_refused(tmp_path):
    run_dir = tmp_path / "run"
    (run_dir / "trace").mkdir(parents=True)
    (run_dir / "summary.json").write_text(json.dumps({"config": to_dict(load_job()), "wall_seconds": 1.0}))
    p = simulate_cli(tmp_path / "out", "--replay", str(run_dir), "--iterations", "3")
    assert p.returncode == 2 and "no trace files" in p.stderr, p.stderr


def test_bench_simulate_prints_each_policy_against_the_bare_loop(tmp_path):
    p = run("bench", "simulate", "--workers", "16", "--iterations", "40", "--json", str(tmp_path / "b.json"))
    assert p.returncode == 0, p.stderr
    records = json.loads((tmp_path / "b.json").read_text())
    assert {r["case"].split(" ")[0] for r in records} == {"bsp", "asp", "ssp(s=3)", "dssp(s=3,r=3)",
                                                          "elasticbsp(R=15)", "psp(β=2,s=3)"}
    assert all(r["reference"] == "bare heapq loop" and r["ratio"] > 0 for r in records)


def test_the_default_job_simulates_with_a_nominal_iteration_time(tmp_path):
    """The default job has straggler.base_s = 0 (a live worker's iteration is its real compute, which a
    simulation does not have): the virtual workers take NOMINAL_BASE_S instead, and the run says so."""
    p = simulate_cli(tmp_path / "sim", "--workers", "3", "--iterations", "4", "--set", "sync.model=elasticbsp",
                     "--set", "straggler.slowdown=[1, 1, 2]")
    assert p.returncode == 0, p.stderr
    summary = json.loads((tmp_path / "sim" / "summary.json").read_text())
    assert summary["iterations"] == [4, 4, 4] and f"taken as {NOMINAL_BASE_S} s" in summary["simulation"]["source"]
    it = read_run(tmp_path / "sim")[3].table("iterations")  # worker 2, twice as slow
    assert np.allclose(it["injected_delay_s"], 2 * NOMINAL_BASE_S)
    workers = ModelWorkers(straggler_model(load_job(None, ["straggler.base_s=0.02"]).straggler, 2, 0))
    assert workers.interval(1, 0, 0.0) == 0.02 and workers.source == "straggler model"  # a base_s of its own


def test_iterations_count_when_every_stop_key_of_the_job_is_0(tmp_path):
    """--iterations K is the job's stop.iterations, so a job that sets no stop at all is complete with it
    (the job's own check used to refuse it first); the run's config says how it ran."""
    p = simulate_cli(tmp_path / "sim", "--workers", "2", "--iterations", "6", "--set", "stop.epochs=0",
                     "--set", "straggler.base_s=0.01")
    assert p.returncode == 0, p.stderr
    summary = json.loads((tmp_path / "sim" / "summary.json").read_text())
    assert summary["iterations"] == [6, 6] and summary["config"]["stop"] == {"iterations": 6, "epochs": 0.0,
                                                                             "seconds": 0.0}
    assert simulate_cli(tmp_path / "none", "--workers", "2", "--set", "stop.epochs=0").returncode == 2


def test_the_job_of_a_live_run_with_its_straggler_section_builds_model_workers():
    job = load_job(None, ["straggler.base_s=0.02", "straggler.spread=2"])
    workers = ModelWorkers(straggler_model(job.straggler, 5, job.seed))
    assert all(0.02 <= workers.interval(w, 0, 0.0) < 0.04 for w in range(5))


def test_many_workers_write_one_file_of_iterations_read_back_as_one_trace_per_rank(tmp_path, monkeypatch):
    """Above WORKER_FILES_MAX workers the iterations go into trace/workers.h5, not a file per rank
    (100,000 workers wrote 82,445 files, 984 MB, in 3 minutes, and no summary); read back, every rank's
    trace and the analysis' tables are those of the same simulation written a file per rank."""
    import ebsp_mpi.sim.run as sim_run
    from ebsp_mpi.trace.frames import load_run

    job = load_job(None, ["sync.model=ssp", "sync.staleness=1", "straggler.base_s=0.01", "straggler.jitter_sigma=0.3",
                          "stop.iterations=3", "stop.epochs=0"])
    workers = 40
    monkeypatch.setattr(sim_run, "WORKER_FILES_MAX", workers - 1)
    (tmp_path / "one").mkdir()
    one = sim_run.simulate_job(job, workers, tmp_path / "one", show_progress=False)
    monkeypatch.setattr(sim_run, "WORKER_FILES_MAX", workers)
    (tmp_path / "each").mkdir()
    each = sim_run.simulate_job(job, workers, tmp_path / "each", show_progress=False)
    assert sorted(p.name for p in (tmp_path / "one" / "trace").iterdir()) == ["rank-0000.h5", "workers.h5"]
    assert len(list((tmp_path / "each" / "trace").iterdir())) == workers + 1
    assert one["iterations"] == each["iterations"] == [3] * workers

    a, b = read_run(tmp_path / "one"), read_run(tmp_path / "each")
    assert sorted(a) == sorted(b) == list(range(workers + 1))
    for rank in range(1, workers + 1):
        assert a[rank].rank == rank and a[rank].role == "worker"
        x, y = a[rank].table("iterations"), b[rank].table("iterations")
        assert x.dtype == y.dtype
        for name in x.dtype.names:  # field by field: NaN (no loss in a simulation) equals NaN
            np.testing.assert_array_equal(x[name], y[name])
    frames_a, frames_b = load_run(tmp_path / "one"), load_run(tmp_path / "each")
    assert frames_a.problems == frames_b.problems == []
    for name in ("iterations", "pushes", "pulls"):
        assert frames_a.table(name).equals(frames_b.table(name)), name


def test_a_simulation_of_100000_workers_writes_two_trace_files(tmp_path):
    p = simulate_cli(tmp_path / "sim", "--workers", "100000", "--iterations", "2", "--set", "straggler.base_s=0.01",
                     timeout=240)
    assert p.returncode == 0, p.stderr
    assert sorted(f.name for f in (tmp_path / "sim" / "trace").iterdir()) == ["rank-0000.h5", "workers.h5"]
    assert json.loads((tmp_path / "sim" / "summary.json").read_text())["iterations"] == [2] * 100000
