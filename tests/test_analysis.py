"""Analysis of finished runs: DataFrames from traces, damaged runs, comparison, report figures, Perfetto JSON.

Runs are built here with the real TraceWriter (one file per rank) and a summary.json, with known numbers,
so that every statistic can be checked exactly; a real MPI run is analysed in tests/test_sweep.py.
"""

import errno
import json
import math
import os
import re
import shutil
import struct
import tempfile
import warnings
from pathlib import Path

import h5py
import numpy as np
import pytest

from ebsp_mpi.analysis import compare, perfetto
from ebsp_mpi.analysis.runs import find_runs, load_infos, model_label
from ebsp_mpi.errors import UsageError
from ebsp_mpi.trace import TraceError, TraceWriter, trace_path

pd = pytest.importorskip("pandas")
pytest.importorskip("matplotlib")

from ebsp_mpi.analysis import metrics  # noqa: E402 - needs pandas
from ebsp_mpi.analysis.report import write_report  # noqa: E402
from ebsp_mpi.trace.frames import RunFrames, load_run  # noqa: E402

WORKERS = 4
SLOW = 3  # worker 3 (rank 4) is three times slower
COMPUTE = 0.002  # seconds of real compute per iteration
BASE = 0.010  # seconds of emulated compute per iteration of a fast worker
TARGETS = (0.9, 0.95)


def _config(sync: str, seed: int) -> dict:
    return {"name": "fake", "seed": seed,
            "sync": {"model": sync, "staleness": 3, "dssp_range": 3, "lookahead": 15, "penalty": 0.0},
            "eval": {"every_seconds": 0.1, "targets": list(TARGETS)},
            "straggler": {"slowdown": [1.0, 1.0, 1.0, 3.0]}}


def _accuracy(t: float, speed: float) -> float:
    return 1.0 - 0.9 * math.exp(-speed * t)


def make_run(path, sync="bsp", seed=0, speed=2.0, rounds=20, summary=True):
    """A 4-worker run: BSP-like rounds (everyone released together when the slow worker pushes) for
    bsp and elasticbsp (whose every 5th round is a recorded barrier), free-running workers otherwise.

    Returns what the tables must show: per worker iterations and total wait.
    """
    cfg = _config(sync, seed)
    iterations, pushes, pulls = _iteration_rows(sync, rounds)
    evals = [(0.1 * k, k, 0.5, _accuracy(0.1 * k, speed), 0.001) for k in range(1, 8)]
    barriers, members = _barrier_rows(rounds) if sync == "elasticbsp" else ([], [])
    server = {"pushes": pushes, "pulls": pulls, "evals": evals, "barriers": barriers, "barrier_members": members}
    _write_traces(path, cfg, server, iterations)
    if summary:
        _write_summary(path, sync, cfg, rounds, iterations, evals, barriers)
    return iterations


def _iteration_rows(sync: str, rounds: int):
    """Per worker its ``iterations`` rows, and the server's ``pushes`` and ``pulls``."""
    iterations = {w: [] for w in range(WORKERS)}
    pushes, pulls = [], []
    version = 0
    lockstep = sync in ("bsp", "elasticbsp")
    t_free = np.zeros(WORKERS)
    for rnd in range(rounds):
        round_start = rnd * (3 * BASE + 0.002)
        for w in range(WORKERS):
            n_here = 1 if lockstep or w == SLOW else 3  # fast workers do 3 iterations per slow one
            for _ in range(n_here):
                t0 = round_start if lockstep else t_free[w]
                delay = (3 if w == SLOW else 1) * BASE - COMPUTE
                t_ce = t0 + COMPUTE + delay
                t_push = t_ce + 0.0001
                t_end = (round_start + 3 * BASE + 0.002) if lockstep else t_push + 0.0005
                i = len(iterations[w])
                iterations[w].append((i, t0, t_ce, t_push, t_end, t_end - t_push, version, 1.0 / (i + 1),
                                      delay, i / 50))
                pushes.append((w, i, t_push + 0.00005, version, 0 if lockstep else w % 3, 0))
                pulls.append((w, t_push + 0.00005, t_end, version + 1))
                t_free[w] = t_end
        version += 1
    return iterations, pushes, pulls


def _barrier_rows(rounds: int):
    """ElasticBSP's ``barriers`` and ``barrier_members``: a barrier every 5th round."""
    barriers, members = [], []
    for b, rnd in enumerate(range(4, rounds, 5)):
        t_rel = rnd * (3 * BASE + 0.002) + 3 * BASE + 0.002
        arrivals = [t_rel - 0.002 - (0 if w == SLOW else 2 * BASE) for w in range(WORKERS)]
        # z = 0: the interval spread is the predicted one, σ 0
        barriers.append((b, t_rel - 0.05, t_rel, t_rel - 0.001, 0.015, max(arrivals) - min(arrivals),
                         0.0, 0.015, 0.0))
        members += [(b, w, 1, t_rel - 0.001, arrivals[w], 0.0) for w in range(WORKERS)]
    return barriers, members


def _write_traces(path, cfg: dict, server: dict, iterations: dict) -> None:
    world = WORKERS + 1
    for rank in range(world):
        attrs = {"run_id": path.name, "rank": rank, "role": "server" if rank == 0 else "worker",
                 "world_size": world, "host": "test", "backend": "numpy", "device": "cpu",
                 "mpi_library": "none", "package_version": "0", "config": cfg, "clock_offset_s": 0.0}
        with TraceWriter(trace_path(path, rank), attrs) as tw:
            tables = server.items() if rank == 0 else [("iterations", iterations[rank - 1])]
            for name, rows in tables:
                for row in rows:
                    tw.append(name, row)


def _write_summary(path, sync: str, cfg: dict, rounds: int, iterations: dict, evals: list, barriers: list) -> None:
    wall = max(r[4] for rows in iterations.values() for r in rows)
    tta = {}
    for target in TARGETS:
        hit = [t for t, _, _, acc, _ in evals if acc >= target]
        tta[repr(target)] = hit[0] if hit else None
    doc = {"name": "fake", "sync": sync, "workers": WORKERS, "wall_seconds": wall,
           "iterations": [len(iterations[w]) for w in range(WORKERS)],
           "wait_seconds": [sum(r[5] for r in iterations[w]) for w in range(WORKERS)],
           "barriers": len(barriers) if sync == "elasticbsp" else (rounds if sync == "bsp" else 0),
           "rejected_pushes": 0, "test_loss": 0.5, "test_accuracy": evals[-1][3],
           "samples_per_second": 1000.0, "time_to_accuracy": tta, "config": cfg}
    (path / "summary.json").write_text(json.dumps(doc))


# -- frames --------------------------------------------------------------------------------------


def test_load_run_gives_one_frame_per_table_with_rank_and_phase_columns(tmp_path):
    iterations = make_run(tmp_path / "run", "asp")
    run = load_run(tmp_path / "run")
    assert run.problems == []
    assert run.sync == "asp" and run.seed == 0 and run.workers == WORKERS and run.world_size == WORKERS + 1
    it = run.table("iterations")
    assert set(it["rank"]) == {1, 2, 3, 4}
    assert (it["worker"] == it["rank"] - 1).all()
    assert len(it) == sum(len(v) for v in iterations.values())
    slow = it[it["worker"] == SLOW]
    np.testing.assert_allclose(slow["compute_s"], COMPUTE, atol=1e-9)
    np.testing.assert_allclose(slow["delay_s"], 3 * BASE - COMPUTE)
    np.testing.assert_allclose(slow["push_s"], 0.0001, atol=1e-9)
    np.testing.assert_allclose(slow["iteration_s"], slow["t_end"] - slow["t_start"])
    pushes = run.table("pushes")
    assert (pushes["rank"] == 0).all() and len(pushes) == len(it)
    # a table no rank wrote is an empty frame with the schema's columns
    assert run.table("barriers").empty and "observed_spread" in run.table("barriers").columns
    with pytest.raises(KeyError, match="known tables"):
        run.table("nope")


def test_truncated_and_missing_rank_files_are_named_and_the_rest_is_read(tmp_path):
    make_run(tmp_path / "run", "bsp")
    damaged = trace_path(tmp_path / "run", 2)
    damaged.write_bytes(damaged.read_bytes()[:600])  # cut off mid-file
    trace_path(tmp_path / "run", 3).unlink()
    with pytest.warns(UserWarning) as caught:
        run = load_run(tmp_path / "run")
    text = " ".join(run.problems)
    assert "rank-0002.h5" in text and "3" in text.split("rank(s)")[1]
    assert any("rank-0002.h5" in str(w.message) for w in caught)
    assert set(run.table("iterations")["rank"]) == {1, 4}  # what could be read is there
    assert len(run.table("pushes")) > 0


def test_missing_summary_is_a_problem_not_an_error(tmp_path):
    make_run(tmp_path / "run", "ssp", summary=False)
    with pytest.warns(UserWarning, match=re.escape("summary.json")):
        run = load_run(tmp_path / "run")
    assert run.summary == {} and run.sync == "ssp"  # from the trace's config
    assert run.wall_seconds > 0


def test_a_directory_without_trace_or_summary_is_an_error(tmp_path):
    (tmp_path / "empty").mkdir()
    with pytest.raises(TraceError, match="empty"):
        load_run(tmp_path / "empty")
    with pytest.raises(TraceError, match="not found"):
        load_run(tmp_path / "nowhere")


def test_a_run_known_by_its_summary_alone_has_its_servers_beside_its_workers(tmp_path):
    """With no trace attributes to say it, the world size is the workers plus runtime.servers."""
    assert RunFrames(path=tmp_path, summary={"workers": 3}, config={"runtime": {"servers": 2}}).world_size == 5
    assert RunFrames(path=tmp_path, summary={"workers": 3}).world_size == 4


# -- metrics -------------------------------------------------------------------------------------


def test_a_slow_link_is_named_the_straggler_as_a_slow_cpu_is(tmp_path):
    """Under BSP every worker iterates at one rate and computes alike here: worker 2 is slow only in
    moving its push and reply (its link), the others wait at the server for it. The straggler is the
    worker whose iterations take longest but for the server's holds, not the one that computes longest."""
    import pandas as pd

    rounds, period = 20, 0.030
    it, pulls = [], []
    for w in range(3):
        own = 0.028 if w == 2 else 0.012  # compute 10 ms (worker 0 a little more) + its transfers
        for i in range(rounds):
            t = i * period
            it.append(dict(worker=w, iteration=i, t_start=t, t_end=t + period, compute_s=0.0101 if w == 0 else 0.010,
                           delay_s=0.0))
            pulls.append(dict(worker=w, t_request=t + own - 0.001, t_reply=t + period - 0.001))
    frames = RunFrames(path=tmp_path, tables={"iterations": pd.DataFrame(it), "pulls": pd.DataFrame(pulls)})
    assert metrics.slowest_worker(frames) == 2
    frames.tables["pulls"] = pd.DataFrame(columns=["worker", "t_request", "t_reply"])  # no server trace
    assert metrics.slowest_worker(frames) == 0  # then the longest compute


def test_worker_stats_rates_and_waiting(tmp_path):
    make_run(tmp_path / "bsp", "bsp", rounds=10)
    run = load_run(tmp_path / "bsp")
    stats = metrics.worker_stats(run)
    assert list(stats["iterations"]) == [10] * WORKERS
    period = 3 * BASE + 0.002
    np.testing.assert_allclose(stats["iterations_per_s"], 10 / (10 * period))
    # a fast worker waits for the slow one: period - (compute + delay + push) per round
    fast_wait = period - (BASE + 0.0001)
    np.testing.assert_allclose(stats.loc[0, "wait_s"], 10 * fast_wait)
    assert stats.loc[SLOW, "wait_share"] < stats.loc[0, "wait_share"]
    assert metrics.slowest_worker(run) == SLOW
    # BSP's barriers are its rounds: one release per version
    assert len(metrics.barrier_times(run)) == 10


def test_spreads_keep_barriers_of_two_or_more_workers(tmp_path):
    make_run(tmp_path / "e", "elasticbsp", rounds=20)
    run = load_run(tmp_path / "e")
    s = metrics.spreads(run)
    assert len(s) == 4
    np.testing.assert_allclose(s["observed_spread"], 2 * BASE)
    np.testing.assert_allclose(s["predicted_spread"], 0.015)
    assert len(metrics.barrier_times(run)) == 4


def test_spread_table_pools_the_barriers_of_each_label(tmp_path):
    from ebsp_mpi.analysis.report import load_runs

    runs, _, problems = load_runs([_sweep(tmp_path, {"bsp": 20.0, "elasticbsp": 30.0}, seeds=(0, 1))])
    assert problems == []
    table = metrics.spread_table(runs)
    assert list(table["model"]) == ["elasticbsp"]  # BSP has no ZipLine barriers
    row = table.iloc[0]
    # one barrier of every worker per run (round 4 of 6): predicted 15 ms, observed 20 ms
    assert (row["runs"], row["barriers_of_2_or_more"]) == (2, 2)
    assert (row["predicted_spread_ms"], row["observed_spread_ms"]) == pytest.approx((15.0, 20.0))
    assert (row["error_median_ms"], row["error_p90_ms"]) == pytest.approx((5.0, 5.0))
    assert len(metrics.spread_table([r for r in runs if r.label == "bsp"])) == 0


# -- runs and comparison -------------------------------------------------------------------------


def _sweep(tmp_path, speeds: dict, seeds=(0, 1, 2)):
    """A sweep directory with a manifest, members named as the sweep runner names them."""
    out = tmp_path / "sweep"
    members = []
    for group, speed in speeds.items():
        sync = group.split("-")[0]
        for seed in seeds:
            name = f"{group}-seed{seed}"
            s = speed[seed] if isinstance(speed, dict) else speed
            if s is not None:
                make_run(out / name, sync, seed, speed=s, rounds=6)
            members.append({"name": name, "group": group, "seed": seed, "dir": name})
    (out / "sweep.json").write_text(json.dumps({"name": "t", "members": members}))
    return out


def test_find_runs_accepts_run_sweep_and_parent_directories(tmp_path):
    make_run(tmp_path / "a", "bsp")
    make_run(tmp_path / "b", "asp")
    assert find_runs([tmp_path]) == [tmp_path / "a", tmp_path / "b"]
    assert find_runs([tmp_path / "b", tmp_path / "b"]) == [tmp_path / "b"]
    with pytest.raises(UsageError, match="no such directory"):
        find_runs([tmp_path / "c"])
    (tmp_path / "d").mkdir()
    with pytest.raises(UsageError, match="neither a run directory"):
        find_runs([tmp_path / "d"])


def test_labels_come_from_the_sweep_manifest_or_the_sync_parameters(tmp_path):
    out = _sweep(tmp_path, {"bsp": 2.0, "ssp-s3": 3.0}, seeds=(0, 1))
    infos = load_infos([out])
    assert [(i.label, i.seed) for i in infos] == [("bsp", 0), ("bsp", 1), ("ssp-s3", 0), ("ssp-s3", 1)]
    assert model_label({"sync": {"model": "dssp", "staleness": 2, "dssp_range": 4}}) == "dssp(s=2,r=4)"
    assert model_label({"sync": {"model": "elasticbsp", "lookahead": 8, "penalty": 0.5}}) == "elasticbsp(R=8,λ=0.5)"
    assert model_label({"sync": {"model": "elasticbsp", "lookahead": 3, "penalty": 0.0, "zipline_z": 1.5,
                                 "predictor": "median"}}) == "elasticbsp(R=3,z=1.5,median)"
    assert (model_label({"sync": {"model": "elasticbsp", "lookahead": 3, "zipline_z": "auto"}})
            == "elasticbsp(R=3,z=auto)")
    assert model_label({"sync": {"model": "elasticbsp", "lookahead": 3, "zipline_z": 0.0}}) == "elasticbsp(R=3)"
    assert model_label({"sync": {"model": "elasticbsp", "lookahead": 15, "zipline_z": "auto", "predictor": "ema",
                                 "overdue": "widen"}}) == "elasticbsp(R=15,z=auto,ema,overdue=widen)"
    assert model_label({"sync": {"model": "elasticbsp", "lookahead": 3, "overdue": "none"}}) == "elasticbsp(R=3)"
    assert model_label({"sync": {"model": "psp", "sample": 2, "staleness": 1}}) == "psp(β=2,s=1)"


def _time_to(speed: float, target: float) -> float:
    """First evaluation time (0.1 s steps) with 1 - 0.9 exp(-speed t) >= target, as make_run records it."""
    k = next(k for k in range(1, 8) if _accuracy(0.1 * k, speed) >= target)
    return 0.1 * k


def test_compare_ratios_to_bsp_of_the_same_seed_and_medians_over_seeds(tmp_path):
    # seed-dependent speeds so that the per-seed ratio differs from the ratio of medians
    bsp = {0: 20.0, 1: 30.0, 2: 40.0}
    asp = {0: 40.0, 1: 20.0, 2: 30.0}
    out = _sweep(tmp_path, {"bsp": bsp, "asp": asp})
    cmp = compare.compare(load_infos([out]))
    assert cmp.targets == list(TARGETS) and cmp.reference == "bsp" and cmp.several_seeds
    t = 0.9
    by_run = {r.info.path.name: r for r in cmp.runs}
    for seed in range(3):
        expected = _time_to(asp[seed], t) / _time_to(bsp[seed], t)
        assert by_run[f"asp-seed{seed}"].ratios[t] == pytest.approx(expected)
        assert by_run[f"bsp-seed{seed}"].ratios[t] == pytest.approx(1.0)
    groups = {g.label: g for g in cmp.groups}
    ratios = [_time_to(asp[s], t) / _time_to(bsp[s], t) for s in range(3)]
    assert groups["asp"].ratio[t] == pytest.approx(float(np.median(ratios)))
    assert groups["asp"].seed_ratios[t] == pytest.approx(ratios)
    assert groups["asp"].times[t] == pytest.approx(float(np.median([_time_to(s, t) for s in asp.values()])))
    text = compare.to_markdown(cmp)
    assert "Per model (median over seeds)" in text and "× bsp" in text


def test_never_reached_and_failed_members_are_shown(tmp_path):
    # asp seed 1 never reaches 0.95 within the run; asp seed 2 failed (no directory)
    out = _sweep(tmp_path, {"bsp": 20.0, "asp": {0: 20.0, 1: 3.0, 2: None}})
    cmp = compare.compare(load_infos([out]))
    by_run = {r.info.path.name: r for r in cmp.runs}
    assert math.isinf(by_run["asp-seed1"].times[0.95]) and math.isinf(by_run["asp-seed1"].ratios[0.95])
    assert not by_run["asp-seed2"].info.finished
    asp = next(g for g in cmp.groups if g.label == "asp")
    assert asp.failed == 1 and asp.reached[0.95] == 1
    text = compare.to_markdown(cmp)
    assert "never" in text and "∞" in text and "failed" in text and "+1 failed" in text
    files = compare.write(cmp, tmp_path / "cmp")
    rows = (tmp_path / "cmp" / "compare.csv").read_text().splitlines()
    assert len(rows) == 1 + 6 and any(",inf," in r for r in rows)
    assert {p.name for p in files} == {"compare.md", "compare.csv", "compare-models.csv"}


def test_no_bsp_run_means_no_ratios(tmp_path):
    make_run(tmp_path / "a", "asp")
    cmp = compare.compare(load_infos([tmp_path / "a"]))
    assert cmp.reference is None and "No BSP run" in compare.to_markdown(cmp)


def break_run(run, how: str) -> None:
    """Damage a run directory the way a crash, a kill or a careless hand leaves it."""
    summary = run / "summary.json"
    if how == "no directory":
        shutil.rmtree(run)
    elif how == "no summary":
        summary.unlink()
    elif how == "null summary":  # a crash after the summary's first fields: no wall time, a partial time
        doc = json.loads(summary.read_text())
        doc.update(wall_seconds=None, test_accuracy=None, test_loss=None, time_to_accuracy={"0.9": 0.05})
        summary.write_text(json.dumps(doc))
    elif how == "summary not JSON":
        summary.write_text('{"sync": "bsp", "wall_')
    elif how == "summary a list":
        summary.write_text("[1, 2]")
    elif how == "summary with a bad field":
        summary.write_text(json.dumps({**json.loads(summary.read_text()), "time_to_accuracy": [0.9]}))
    elif how == "no traces":
        shutil.rmtree(run / "trace")
    elif how == "empty trace directory":
        shutil.rmtree(run / "trace")
        (run / "trace").mkdir()
    elif how == "truncated rank 0":
        path = trace_path(run, 0)
        path.write_bytes(path.read_bytes()[:600])
    else:
        raise ValueError(how)


#: the ways a member can fail to finish (summary missing, null, unreadable) and still be in the sweep
UNFINISHED = ("no directory", "no summary", "null summary", "summary not JSON", "summary a list",
              "summary with a bad field")


@pytest.mark.parametrize("how", UNFINISHED)
def test_a_reference_run_that_did_not_finish_gives_its_seed_no_ratio(tmp_path, how):
    bsp = {0: 20.0, 1: 30.0}
    out = _sweep(tmp_path, {"bsp": bsp, "asp": 40.0}, seeds=(0, 1))
    break_run(out / "bsp-seed0", how)
    cmp = compare.compare(load_infos([out]))
    by_run = {r.info.path.name: r for r in cmp.runs}
    # neither a ratio against the crashed run (0.05 s in the null summary) nor the other seed's time
    assert by_run["asp-seed0"].ratios == {0.9: None, 0.95: None}
    assert not by_run["bsp-seed0"].info.finished and by_run["bsp-seed0"].info.problem
    assert cmp.reference == "bsp" and cmp.failed_reference_seeds == [0]
    assert by_run["asp-seed1"].ratios[0.9] == pytest.approx(_time_to(40.0, 0.9) / _time_to(bsp[1], 0.9))
    groups = {g.label: g for g in cmp.groups}
    assert groups["bsp"].failed == 1 and groups["bsp"].times[0.9] == pytest.approx(_time_to(bsp[1], 0.9))
    assert groups["asp"].seed_ratios[0.9][0] is None
    text = compare.to_markdown(cmp)
    assert "Seed 0: the bsp run did not finish, so the runs of seed 0 have no ratio" in text
    assert "| bsp-seed0 | bsp | 0 | failed: " in text


def test_the_default_reference_is_a_bsp_label_with_a_finished_run(tmp_path):
    out = _sweep(tmp_path, {"bsp-a": 20.0, "bsp-b": 30.0, "asp": 40.0}, seeds=(0,))
    break_run(out / "bsp-a-seed0", "no summary")  # still a BSP run, by the job in its traces
    infos = load_infos([out])
    assert [i.model for i in infos if i.label == "bsp-a"] == ["bsp"]
    cmp = compare.compare(infos)
    assert cmp.reference == "bsp-b"
    asp = next(r for r in cmp.runs if r.info.label == "asp")
    assert asp.ratios[0.9] == pytest.approx(_time_to(40.0, 0.9) / _time_to(30.0, 0.9))


def test_no_finished_bsp_run_means_no_ratios_and_says_why(tmp_path):
    out = _sweep(tmp_path, {"bsp": 20.0, "asp": 40.0}, seeds=(0,))
    break_run(out / "bsp-seed0", "null summary")
    cmp = compare.compare(load_infos([out]))
    assert cmp.reference is None and all(r.ratios[0.9] is None for r in cmp.runs)
    assert "No ratios: no run of bsp (BSP) finished" in compare.to_markdown(cmp)
    with pytest.raises(ValueError, match="reference label 'bsp': none of its runs finished"):
        compare.compare(load_infos([out]), reference="bsp")


# -- report --------------------------------------------------------------------------------------


def _png_size(path):
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n", f"{path} is not a PNG"
    return struct.unpack(">II", data[16:24])


def test_report_writes_tables_and_every_figure(tmp_path):
    out = _sweep(tmp_path, {"bsp": 20.0, "asp": 40.0, "elasticbsp": 30.0}, seeds=(0, 1))
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a clean run gives no warning
        report = write_report([out], tmp_path / "report")
    assert report.problems == []
    assert set(report.titles) == {"accuracy.png", "timeline.png", "wait.png", "iterations.png",
                                  "staleness.png", "zipline.png"}
    for name in report.titles:
        w, h = _png_size(tmp_path / "report" / name)
        assert w >= 800 and h >= 400
    # the titles state what the runs show, in their numbers
    assert report.titles["accuracy.png"].startswith("First to 95% test accuracy: asp")
    assert report.titles["staleness.png"].endswith("the largest is 2 under asp, 0 under bsp")
    # lockstep rounds: everyone at the slow worker's pace; asp: 30.6 ms against 10.6 ms per iteration
    assert report.titles["iterations.png"].endswith("run 2.9× under asp, 1.0× under bsp")
    assert "under bsp" in report.titles["timeline.png"] and "under asp" in report.titles["timeline.png"]
    # one barrier per elasticbsp run (round 4 of 6), predicted 15 ms, observed 20 ms
    assert "observed 20.0 ms against 15.0 ms predicted (medians over 2 barriers)" in report.titles["zipline.png"]
    table = pd.read_csv(tmp_path / "report" / "summary.csv")
    assert len(table) == 6 and set(table["model"]) == {"bsp", "asp", "elasticbsp"}
    page = (tmp_path / "report" / "report.md").read_text()
    assert "![Staleness histogram](staleness.png)" in page and "| run |" in page
    zipline = pd.read_csv(tmp_path / "report" / "zipline.csv")
    assert list(zipline["model"]) == ["elasticbsp"] and list(zipline["barriers_of_2_or_more"]) == [2]
    assert "## ZipLine's prediction error" in page


def test_an_accuracy_title_names_a_reference_that_recorded_no_time_for_the_target(tmp_path):
    """The reference (bsp) has no time to the targets (a simulated run, or one with other
    eval.targets): the title says so instead of failing on the missing time."""
    make_run(tmp_path / "asp", "asp", speed=40.0)
    make_run(tmp_path / "bsp", "bsp", speed=20.0)
    doc = json.loads((tmp_path / "bsp" / "summary.json").read_text())
    doc["time_to_accuracy"] = {}
    (tmp_path / "bsp" / "summary.json").write_text(json.dumps(doc))
    report = write_report([tmp_path / "asp", tmp_path / "bsp"], tmp_path / "report")
    assert report.titles["accuracy.png"].startswith("First to 95% test accuracy: asp at ")
    assert report.titles["accuracy.png"].endswith("; bsp: not recorded")


def test_report_without_elasticbsp_notes_the_missing_zipline_figure(tmp_path):
    make_run(tmp_path / "bsp", "bsp")
    report = write_report([tmp_path / "bsp"], tmp_path / "report")
    assert "zipline.png" not in report.titles and not (tmp_path / "report" / "zipline.png").exists()
    assert any("ZipLine" in p for p in report.problems)


# -- Perfetto ------------------------------------------------------------------------------------


def test_perfetto_json_has_a_track_per_rank_and_complete_events(tmp_path):
    make_run(tmp_path / "e", "elasticbsp", rounds=10)
    perfetto.write(tmp_path / "e", tmp_path / "trace.json")
    doc = json.loads((tmp_path / "trace.json").read_text())
    events = doc["traceEvents"]
    assert all(all(k in e for k in ("ph", "ts", "pid", "tid")) for e in events)
    assert {e["pid"] for e in events} == set(range(WORKERS + 1))
    names = {e["pid"]: e["args"]["name"] for e in events if e["ph"] == "M" and e["name"] == "process_name"}
    assert names[0] == "rank 0: parameter server" and names[4] == "rank 4: worker 3"
    # every phase slice lies inside its iteration's slice
    for rank in range(1, WORKERS + 1):
        slices = [e for e in events if e["pid"] == rank and e["ph"] == "X"]
        iters = [e for e in slices if e["cat"] == "iteration"]
        phases = [e for e in slices if e["cat"] == "phase"]
        assert len(iters) == 10 and len(phases) >= 4 * 10
        for p in phases:
            assert any(i["ts"] - 1e-6 <= p["ts"] and p["ts"] + p["dur"] <= i["ts"] + i["dur"] + 1e-6 for i in iters)
    released = [e for e in events if e["ph"] == "i" and e.get("s") == "g"]
    assert len(released) == 2  # barriers 0 and 1 of rounds 4 and 9
    assert sum(1 for e in events if e["ph"] == "C") == 7  # one accuracy sample per evaluation
    assert doc["otherData"]["missing_ranks"] == []


def test_perfetto_json_of_a_diverged_run_is_strict_json(tmp_path):
    make_run(tmp_path / "a", "bsp", rounds=6)
    with h5py.File(trace_path(tmp_path / "a", 0), "r+") as h5:  # the model diverged: NaN loss and accuracy
        evals = h5["evals"][()]
        evals["test_acc"], evals["test_loss"] = np.nan, np.inf
        h5["evals"][...] = evals
    perfetto.write(tmp_path / "a", tmp_path / "t.json")

    def refuse(constant):
        raise ValueError(f"{constant} is not JSON")

    doc = json.loads((tmp_path / "t.json").read_text(), parse_constant=refuse)
    evaluated = [e for e in doc["traceEvents"] if e["name"] == "evaluate"]
    assert len(evaluated) == 7 and all(e["args"]["test_acc"] is None for e in evaluated)
    assert not any(e["ph"] == "C" for e in doc["traceEvents"])  # no accuracy counter without a value


def test_perfetto_names_a_missing_rank(tmp_path):
    make_run(tmp_path / "a", "asp")
    trace_path(tmp_path / "a", 2).unlink()
    doc = perfetto.trace_events(tmp_path / "a")
    assert doc["otherData"]["missing_ranks"] == [2]
    assert 2 not in {e["pid"] for e in doc["traceEvents"]}


# -- command line: python -m ebsp_mpi report / compare / timeline --------------------------------


def _runs(tmp_path, layout):
    """A single run, or a sweep of three runs; returns (directory to name, the run directories)."""
    if layout == "run":
        make_run(tmp_path / "e", "elasticbsp", rounds=10)
        return tmp_path / "e", [tmp_path / "e"]
    out = _sweep(tmp_path, {"bsp": 20.0, "asp": 40.0, "elasticbsp": 30.0}, seeds=(0,))
    return out, [out / name for name in ("bsp-seed0", "asp-seed0", "elasticbsp-seed0")]


def _pids(path):
    return {e["pid"] for e in json.loads(path.read_text())["traceEvents"]}


@pytest.mark.parametrize("layout", ["run", "sweep"])
def test_report_subcommand_writes_the_page_and_a_summary_row_per_run(tmp_path, capsys, layout):
    from ebsp_mpi.cli import main

    src, runs = _runs(tmp_path, layout)
    assert main(["report", str(src), "--out", str(tmp_path / "report")]) == 0
    table = pd.read_csv(tmp_path / "report" / "summary.csv")
    assert sorted(table["run"]) == sorted(r.name for r in runs)
    page = (tmp_path / "report" / "report.md").read_text()
    assert f"# Report of {len(runs)} run(s)" in page
    out = capsys.readouterr().out.splitlines()
    assert out[-1] == f"{tmp_path / 'report' / 'report.md'}: the report on one page"
    assert any(line.startswith(f"{tmp_path / 'report' / 'timeline.png'}: ") for line in out)


@pytest.mark.parametrize("layout", ["run", "sweep"])
def test_compare_subcommand_prints_and_writes_a_row_per_run(tmp_path, capsys, layout):
    from ebsp_mpi.cli import main

    src, runs = _runs(tmp_path, layout)
    assert main(["compare", str(src), "--out", str(tmp_path / "cmp")]) == 0
    printed = capsys.readouterr()
    written = (tmp_path / "cmp" / "compare.md").read_text()
    for run in runs:
        assert f"| {run.name} |" in printed.out and f"| {run.name} |" in written
    assert printed.err.count("wrote ") == 3
    assert len((tmp_path / "cmp" / "compare.csv").read_text().splitlines()) == 1 + len(runs)


def test_compare_subcommand_exits_1_when_a_member_did_not_finish(tmp_path, capsys):
    from ebsp_mpi.cli import main

    out = _sweep(tmp_path, {"bsp": 20.0, "asp": {0: 20.0, 1: None}}, seeds=(0, 1))
    assert main(["compare", str(out)]) == 1
    assert "| asp-seed1 |" in capsys.readouterr().out


def test_compare_subcommand_with_an_unknown_reference_is_a_one_line_error(tmp_path, capsys):
    from ebsp_mpi.cli import main

    make_run(tmp_path / "a", "asp")
    assert main(["compare", str(tmp_path / "a"), "--reference", "nope"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("ebsp_mpi: error: reference label 'nope'")


def test_timeline_subcommand_on_a_run_writes_a_track_per_rank(tmp_path, capsys):
    from ebsp_mpi.cli import main

    src, _ = _runs(tmp_path, "run")
    path = tmp_path / "deeper" / "trace.json"  # the parent directory is created
    assert main(["timeline", str(src), "-o", str(path)]) == 0
    assert _pids(path) == set(range(WORKERS + 1))
    out = capsys.readouterr().out.splitlines()
    assert len(out) == 1 and out[0].startswith(f"{path}: ") and "tracks for ranks [0, 1, 2, 3, 4]" in out[0]
    assert main(["timeline", str(src), "-o", str(tmp_path)]) == 2  # one run needs a file, not a directory
    assert capsys.readouterr().err.startswith(f"ebsp_mpi: error: -o {tmp_path}: a directory")


def test_timeline_subcommand_on_a_sweep_writes_one_file_per_member(tmp_path, capsys):
    from ebsp_mpi.cli import main

    src, runs = _runs(tmp_path, "sweep")
    assert main(["timeline", str(src), "-o", str(tmp_path / "timelines")]) == 0
    assert sorted(p.name for p in (tmp_path / "timelines").iterdir()) == sorted(f"{r.name}.json" for r in runs)
    for run in runs:
        doc = json.loads((tmp_path / "timelines" / f"{run.name}.json").read_text())
        assert {e["pid"] for e in doc["traceEvents"]} == set(range(WORKERS + 1))
        assert doc["otherData"]["sync"] == run.name.split("-")[0]
    out = capsys.readouterr().out.splitlines()  # one line per file written
    assert sorted(line.split(": ")[0] for line in out) == sorted(
        str(tmp_path / "timelines" / f"{r.name}.json") for r in runs)


def test_timeline_subcommand_names_each_run_apart_when_two_sweeps_share_member_names(tmp_path, capsys):
    from ebsp_mpi.cli import main

    parent = tmp_path / "sweeps"
    parent.mkdir()
    for name in ("one", "two"):
        _sweep(tmp_path / name, {"bsp": 20.0}, seeds=(0,)).rename(parent / name)
    assert main(["timeline", str(parent), "-o", str(tmp_path / "timelines")]) == 0
    assert sorted(p.name for p in (tmp_path / "timelines").iterdir()) == ["one-bsp-seed0.json", "two-bsp-seed0.json"]
    assert len(capsys.readouterr().out.splitlines()) == 2


def test_timeline_subcommand_on_a_sweep_skips_a_failed_member_and_exits_1(tmp_path, capsys):
    from ebsp_mpi.cli import main

    out = _sweep(tmp_path, {"bsp": 20.0, "asp": {0: 20.0, 1: None}}, seeds=(0, 1))
    assert main(["timeline", str(out), "-o", str(tmp_path / "timelines")]) == 1
    assert sorted(p.name for p in (tmp_path / "timelines").iterdir()) == [
        "asp-seed0.json", "bsp-seed0.json", "bsp-seed1.json"]
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and err[0].startswith("timeline: note: skipped") and "asp-seed1" in err[0]


@pytest.mark.parametrize("command", ["report", "compare", "timeline"])
def test_analysis_subcommands_on_a_missing_directory_fail_with_one_line(tmp_path, capsys, command):
    from ebsp_mpi.cli import main

    missing = tmp_path / "nowhere"
    out = ["-o", str(tmp_path / "t.json")] if command == "timeline" else ["--out", str(tmp_path / "out")]
    assert main([command, str(missing), *out]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(f"ebsp_mpi: error: {missing}: no such directory")
    assert not (tmp_path / "out").exists() and not (tmp_path / "t.json").exists()


@pytest.mark.parametrize("command", ["report", "compare", "timeline"])
def test_analysis_subcommands_on_a_directory_without_runs_fail_with_one_line(tmp_path, capsys, command):
    from ebsp_mpi.cli import main

    (tmp_path / "empty").mkdir()
    out = ["-o", str(tmp_path / "t.json")] if command == "timeline" else ["--out", str(tmp_path / "out")]
    assert main([command, str(tmp_path / "empty"), *out]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(f"ebsp_mpi: error: {tmp_path / 'empty'}: neither a run")


@pytest.mark.parametrize("layout", ["run", "sweep"])
def test_timeline_and_report_of_broken_traces_fail_with_one_line(tmp_path, capsys, layout):
    from ebsp_mpi.cli import main

    src, runs = _runs(tmp_path, layout)
    for run in runs:
        for rank in range(WORKERS + 1):
            path = trace_path(run, rank)
            path.write_bytes(path.read_bytes()[:600])  # every rank file cut off mid-file
    assert main(["timeline", str(src), "-o", str(tmp_path / "t")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("ebsp_mpi: error: ") and "rank-0000.h5" in err
    assert main(["report", str(src), "--out", str(tmp_path / "report")]) == 2
    err = capsys.readouterr().err.splitlines()
    assert err[-1].startswith("ebsp_mpi: error: no run with readable worker iterations")
    assert all(line.startswith("report: note:") for line in err[:-1])


# -- command line on broken runs and unwritable places ---------------------------------------------


def _member_broken(how, member="asp-seed1"):
    """A sweep of bsp and asp over seeds 0 and 1 whose member ``member`` is broken ``how``."""
    def build(tmp_path):
        out = _sweep(tmp_path, {"bsp": 20.0, "asp": 40.0}, seeds=(0, 1))
        break_run(out / member, how)
        return out
    return build


def _foreign_rank(tmp_path):
    make_run(tmp_path / "a", "bsp", rounds=6)
    make_run(tmp_path / "b", "asp", rounds=6)
    shutil.copy(trace_path(tmp_path / "b", 3), trace_path(tmp_path / "a", 3))
    return tmp_path / "a"


def _run_without_summary(tmp_path):
    make_run(tmp_path / "a", "asp", rounds=6, summary=False)
    return tmp_path / "a"


def _run_where(change):
    """A single run whose trace files were changed by ``change(run)`` (by hand, or by another program)."""
    def build(tmp_path):
        make_run(tmp_path / "a", "asp", rounds=6)
        change(tmp_path / "a")
        return tmp_path / "a"
    return build


def _table_of_another_schema(run):
    with h5py.File(trace_path(run, 2), "r+") as h5:
        del h5["iterations"]
        h5["iterations"] = np.arange(10)


def _two_names_for_rank_1(run):
    shutil.copy(trace_path(run, 2), run / "trace" / "rank-1.h5")


def _world_size_a_word(run):
    with h5py.File(trace_path(run, 0), "r+") as h5:
        h5.attrs["world_size"] = "five"


def _manifest(members_json):
    """A sweep whose manifest is replaced by ``members_json`` (None: names a member never run)."""
    def build(tmp_path):
        out = _sweep(tmp_path, {"bsp": 20.0}, seeds=(0,))
        manifest = out / "sweep.json"
        if members_json is None:
            doc = json.loads(manifest.read_text())
            doc["members"].append({"name": "ghost", "group": "ghost", "seed": 0, "dir": "ghost-seed0"})
            manifest.write_text(json.dumps(doc))
        else:
            manifest.write_text(members_json)
        return out
    return build


#: (case, how the input is built, command, exit code, a fragment of stderr or None for nothing but
#: the usual lines). Exit codes: 1 for a run that did not finish (report and compare alike), or for a
#: sweep member timeline has no trace of; 2 when nothing can be made of the input; notes name the file.
BROKEN = [
    *[(how, _member_broken(how), cmd, code, fragment) for how, fragment in (
        ("no summary", "asp-seed1/summary.json: missing"),
        ("null summary", "asp-seed1/summary.json: no wall time (wall_seconds is null or missing)"),
        ("summary not JSON", "asp-seed1/summary.json: unreadable"),
        ("summary a list", "asp-seed1/summary.json: not a JSON object but list"),
        ("summary with a bad field", "'time_to_accuracy' is [0.9], expected an object or null"),
    ) for cmd, code in (("report", 1), ("compare", 1))],
    *[(how, _member_broken(how), "timeline", 0, None) for how in (  # the traces are whole: nothing to say
        "no summary", "null summary", "summary not JSON", "summary a list", "summary with a bad field")],
    ("no directory", _member_broken("no directory"), "report", 1, "asp-seed1: missing (the member failed"),
    ("no directory", _member_broken("no directory"), "compare", 1, "asp-seed1: missing (the member failed"),
    ("no directory", _member_broken("no directory"), "timeline", 1, "timeline: note: skipped"),
    ("no traces", _member_broken("no traces"), "report", 0, "asp-seed1/trace"),
    ("no traces", _member_broken("no traces"), "compare", 0, None),  # compare reads summaries only
    ("no traces", _member_broken("no traces"), "timeline", 1, "no trace directory in run"),
    ("empty trace directory", _member_broken("empty trace directory"), "report", 0, "no trace files"),
    ("empty trace directory", _member_broken("empty trace directory"), "timeline", 1, "no trace files"),
    ("truncated rank 0", _member_broken("truncated rank 0"), "report", 0, "rank-0000.h5"),
    ("truncated rank 0", _member_broken("truncated rank 0"), "timeline", 0, "rank-0000.h5"),
    ("foreign rank file", _foreign_rank, "report", 0, "its run id is 'b', this run's is 'a'"),
    ("foreign rank file", _foreign_rank, "timeline", 0, "its run id is 'b', this run's is 'a'"),
    ("foreign rank file", _foreign_rank, "compare", 0, None),
    ("run without summary", _run_without_summary, "report", 1, "summary.json: missing"),
    ("run without summary", _run_without_summary, "compare", 1, "summary.json: missing"),
    ("run without summary", _run_without_summary, "timeline", 0, None),
    *[("member never run", _manifest(None), cmd, 1, "ghost-seed0: missing") for cmd in ("report", "compare")],
    ("member never run", _manifest(None), "timeline", 1, "skipped"),
    *[("table of another schema", _run_where(_table_of_another_schema), cmd, 0,
       "rank-0002.h5: table 'iterations' is not one of this trace schema") for cmd in ("report", "timeline")],
    *[("two names for one rank", _run_where(_two_names_for_rank_1), cmd, 0, "rank-1.h5: rank-0001.h5 is rank 1's")
      for cmd in ("report", "timeline")],
    *[("world size a word", _run_where(_world_size_a_word), cmd, 0, None) for cmd in ("report", "timeline")],
    *[("sweep of no members", _manifest('{"members": []}'), cmd, 2, "sweep.json: names no members") for cmd in
      ("report", "compare", "timeline")],
    *[("manifest not JSON", _manifest("{oops"), cmd, 2, "unreadable sweep manifest") for cmd in
      ("report", "compare", "timeline")],
    *[(f"manifest {text}", _manifest(text), cmd, 2, "not a sweep manifest") for cmd in ("report", "compare", "timeline")
      for text in ("[]", '{"members": 3}', '{"members": [{"name": "a"}]}')],
]


def _output(command, tmp_path, name="out"):
    return ["-o" if command == "timeline" else "--out", str(tmp_path / name)]


@pytest.mark.parametrize("case, build, command, code, fragment", BROKEN,
                         ids=[f"{case}-{command}" for case, _, command, _, _ in BROKEN])
def test_broken_inputs_give_notes_or_one_error_line_never_a_traceback(tmp_path, capsys, case, build, command,
                                                                        code, fragment):
    from ebsp_mpi.cli import main

    src = build(tmp_path)
    assert main([command, str(src), *_output(command, tmp_path)]) == code
    err = capsys.readouterr().err.splitlines()
    if code == 2:
        assert len(err) == 1 and err[0].startswith("ebsp_mpi: error: ")
    else:  # the usual lines, each one line: notes, and compare's "wrote"
        assert all(line.startswith((f"{command}: note: ", "wrote ")) for line in err), err
    if fragment is None:
        assert not any(": note: " in line and "ZipLine" not in line for line in err), err
    else:
        assert any(fragment in line for line in err), err


def test_report_on_a_sweep_with_failed_members_reports_the_finished_ones(tmp_path, capsys):
    from ebsp_mpi.cli import main

    out = _sweep(tmp_path, {"bsp": 20.0, "asp": 40.0}, seeds=(0, 1, 2))
    break_run(out / "asp-seed1", "null summary")   # crashed: traces, and a summary without a wall time
    break_run(out / "bsp-seed2", "no directory")   # failed before it started
    break_run(out / "asp-seed2", "no traces")      # finished, but its traces are gone
    shutil.rmtree(out / "asp-seed2")               # ... and then the whole directory
    assert main(["report", str(out), "--out", str(tmp_path / "report")]) == 1
    err = capsys.readouterr().err.splitlines()
    table = pd.read_csv(tmp_path / "report" / "summary.csv")
    assert sorted(table["run"]) == ["asp-seed0", "asp-seed1", "bsp-seed0", "bsp-seed1"]  # all with traces
    page = (tmp_path / "report" / "report.md").read_text()
    assert "# Report of 4 run(s); 3 did not finish (see Problems)" in page
    problems = page.split("## Problems")[1].split("## Summary")[0]
    for member in ("asp-seed1", "bsp-seed2", "asp-seed2"):
        assert member in problems
        assert any(line.startswith("report: note: ") and member in line for line in err)
    # the comparison inside the report: failed rows, and no ratio for seed 2 whose BSP run never ran
    assert "| asp-seed1 | asp | 1 | failed: " in page and "Seed 2: the bsp run did not finish" in page


@pytest.mark.parametrize("window", [["nan", "1"], ["0", "inf"], ["0", "0"], ["0", "-5"]])
def test_a_window_of_no_finite_length_is_one_line(tmp_path, capsys, window):
    from ebsp_mpi.cli import main

    make_run(tmp_path / "a", "asp", rounds=6)
    assert main(["report", str(tmp_path / "a"), "--out", str(tmp_path / "out"), "--window", *window]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("ebsp_mpi: error: --window ") and "LENGTH > 0" in err
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("command", ["report", "compare", "timeline"])
def test_an_output_path_that_is_a_file_is_one_line(tmp_path, capsys, command):
    from ebsp_mpi.cli import main

    src, _ = _runs(tmp_path, "sweep")
    (tmp_path / "taken").write_text("not a directory")
    assert main([command, str(src), *_output(command, tmp_path, "taken")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(f"ebsp_mpi: error: {_output(command, tmp_path, 'taken')[0]} "
                                                   f"{tmp_path / 'taken'}: a file")
    # and below a file: the directory cannot be made
    assert main([command, str(src), *_output(command, tmp_path, "taken/sub")]) == 2
    err = capsys.readouterr().err
    assert err == f"ebsp_mpi: error: cannot write {tmp_path / 'taken' / 'sub'}: Not a directory\n"
    assert main(["timeline", str(src / "bsp-seed0"), "-o", str(tmp_path / "taken" / "t.json")]) == 2
    assert capsys.readouterr().err == (f"ebsp_mpi: error: -o {tmp_path / 'taken' / 't.json'}: "
                                       f"{tmp_path / 'taken'} is a file, not a directory\n")


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into a read-only directory: permissions do not apply")
@pytest.mark.parametrize("command", ["report", "compare", "timeline"])
def test_a_read_only_output_directory_is_one_line(tmp_path, capsys, command):
    from ebsp_mpi.cli import main

    src, _ = _runs(tmp_path, "sweep")
    (tmp_path / "ro").mkdir()
    (tmp_path / "ro").chmod(0o500)
    try:
        assert main([command, str(src), *_output(command, tmp_path, "ro")]) == 2
    finally:
        (tmp_path / "ro").chmod(0o700)
    assert capsys.readouterr().err == f"ebsp_mpi: error: cannot write {tmp_path / 'ro'}: Permission denied\n"
    assert list((tmp_path / "ro").iterdir()) == []


def _refuse_new_files(monkeypatch, where):
    """Make the operating system refuse a new file in ``where`` as in a read-only directory; as root,
    chmod does not, so the refusal is simulated where the command asks for it."""
    real = tempfile.TemporaryFile

    def refuse(*args, dir=None, **kwargs):
        if dir is not None and Path(dir) == where:
            raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), str(where))
        return real(*args, dir=dir, **kwargs)

    monkeypatch.setattr(tempfile, "TemporaryFile", refuse)


@pytest.mark.parametrize("command", ["report", "compare", "timeline"])
def test_an_output_directory_that_refuses_files_is_one_line_before_any_work(tmp_path, capsys, monkeypatch,
                                                                              command):
    from ebsp_mpi.cli import main

    src, _ = _runs(tmp_path, "sweep")
    (tmp_path / "ro").mkdir()
    _refuse_new_files(monkeypatch, tmp_path / "ro")
    assert main([command, str(src), *_output(command, tmp_path, "ro")]) == 2
    captured = capsys.readouterr()
    assert captured.err == f"ebsp_mpi: error: cannot write {tmp_path / 'ro'}: Permission denied\n"
    assert captured.out == ""  # compare prints no table it then cannot write
    assert list((tmp_path / "ro").iterdir()) == []


@pytest.mark.parametrize("command, name", [("report", "compare.md"), ("compare", "compare.md"),
                                           ("timeline", "bsp-seed0.json")])
def test_a_write_that_fails_after_the_check_names_the_file(tmp_path, capsys, monkeypatch, command, name):
    from ebsp_mpi.cli import main

    src, _ = _runs(tmp_path, "sweep")
    out = tmp_path / "out"
    real = Path.write_text

    def disk_full(self, *args, **kwargs):
        if self.parent == out:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(self))
        return real(self, *args, **kwargs)

    monkeypatch.setattr(Path, "write_text", disk_full)
    assert main([command, str(src), *_output(command, tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err == f"ebsp_mpi: error: cannot write {out / name}: No space left on device\n"


def test_report_without_the_analysis_extra_says_what_to_install(tmp_path):
    import subprocess
    import sys

    make_run(tmp_path / "a", "asp")
    code = ("import sys; sys.modules['pandas'] = None; from ebsp_mpi.cli import main; "
            f"sys.exit(main(['report', {str(tmp_path / 'a')!r}, '--out', {str(tmp_path / 'out')!r}]))")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert p.returncode == 2, p.stderr
    assert p.stderr == 'ebsp_mpi: error: report needs pandas (the analysis extra): pip install -e ".[analysis]"\n'


def test_report_and_compare_write_a_path_that_is_not_utf8_as_escapes(tmp_path):
    """A run directory whose name is not UTF-8 (a Latin-1 é, as Python decodes it from the file
    system) is read, reported and compared; every file written is UTF-8, the byte shown as ``\\xe9``
    (``safe_text.clean_text``), as in the run's own outputs."""
    run = Path(os.fsdecode(bytes(tmp_path) + b"/r\xe9sultat"))
    make_run(run, "bsp", 0, speed=2.0)
    report = write_report([run], tmp_path / "report")
    assert report.files
    for f in (tmp_path / "report").iterdir():
        if f.suffix in (".md", ".csv"):
            text = f.read_bytes().decode("utf-8")  # strict: a surrogate would have failed the write
            if f.name in ("compare.md", "compare.csv", "summary.csv", "report.md"):
                assert "r\\xe9sultat" in text, f.name
    cmp = compare.compare(load_infos([run]))
    written = compare.write(cmp, tmp_path / "cmp")
    texts = {p.name: p.read_bytes().decode("utf-8") for p in written}
    assert "r\\xe9sultat" in texts["compare.csv"] and "r\\xe9sultat" in texts["compare.md"], texts


def test_simulated_runs_are_marked_and_never_divided_by_a_live_runs_seconds(tmp_path):
    """A simulated run counts virtual seconds: in one comparison with live runs its label says so, and
    it has a ratio only to a reference on its own clock (it had one to the live BSP run before)."""
    live_bsp, live_asp, sim_asp = tmp_path / "bsp", tmp_path / "asp", tmp_path / "asp-sim"
    make_run(live_bsp, "bsp", 0, speed=20.0)
    make_run(live_asp, "asp", 0, speed=40.0)
    make_run(sim_asp, "asp", 0, speed=40.0)
    doc = json.loads((sim_asp / "summary.json").read_text())
    (sim_asp / "summary.json").write_text(json.dumps({**doc, "backend": "simulated"}))
    cmp = compare.compare(load_infos([live_bsp, live_asp, sim_asp]))
    by_path = {r.info.path.name: r for r in cmp.runs}
    assert by_path["asp-sim"].info.label.endswith(" (simulated)") and by_path["asp-sim"].info.label != \
        by_path["asp"].info.label
    assert cmp.reference == "bsp"
    assert all(x is None for x in by_path["asp-sim"].ratios.values())
    assert any(x is not None for x in by_path["asp"].ratios.values())
    assert "count virtual seconds" in compare.to_markdown(cmp)
