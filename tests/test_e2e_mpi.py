"""End to end: ``mpiexec -n K python -m ebsp_mpi train`` as a subprocess, checked through its outputs.

Each launch carries a timeout (a hung rank fails the test instead of the CI run).
"""

import json
import re
import signal
import time
from pathlib import Path

import h5py
import numpy as np
import pytest

from ebsp_mpi.outputs import SUMMARY_KEYS, read_model
from ebsp_mpi.trace import read_run
from datafiles import write_poisoned
from mpirun import dead_rank_named, local, signal_rank_mid_run, signal_until_named, train, watchdog_flags

pytestmark = [pytest.mark.timeout(600), pytest.mark.slow]

ORACLE = ["sync.model=bsp", "stop.iterations=50", "optim.momentum=0.9", "optim.weight_decay=5e-4"]
STRAGGLER = ["straggler.slowdown=[1, 1, 3]", "straggler.base_s=0.004", "straggler.jitter_sigma=0.1"]


def summary(run_dir: Path) -> dict:
    return json.loads((run_dir / "summary.json").read_text())


@pytest.mark.parametrize("kind,wire", [
    # dozens of chunks per push and reply, wait-free backprop
    pytest.param("mlp", ["runtime.chunk_bytes=4096"], marks=pytest.mark.mpi_impl),
    ("cnn", ["runtime.wait_free_backprop=false"]),
])
def test_bsp_over_mpi_equals_the_single_process_oracle(kind, wire, tmp_path):
    """docs/design.md, "Synchronization models": BSP with n workers equals the reference trainer with
    sync.workers = n, however the gradient and the weights are cut into messages and whenever they are sent."""
    p = train(4, tmp_path / "mpi", f"model.kind={kind}", "straggler.enabled=false", *wire, *ORACLE)
    assert p.returncode == 0, p.stderr
    q = local(tmp_path / "oracle", f"model.kind={kind}", "sync.workers=3", *ORACLE)
    assert q.returncode == 0, q.stderr
    a, attrs_a = read_model(tmp_path / "mpi" / "model.h5")
    b, attrs_b = read_model(tmp_path / "oracle" / "model.h5")
    assert sorted(a) == sorted(b)
    assert attrs_a["version"] == attrs_b["version"] == 50
    assert max(float(np.abs(a[k] - b[k]).max()) for k in a) <= 1e-5


@pytest.mark.mpi_impl
def test_single_process_and_mpi_runs_write_the_same_summary_keys(tmp_path):
    """One builder for summary.json: the same keys, in the same order, whichever trainer ran; a key that
    does not apply is null (no MPI library without MPI, no injected delay in the single process)."""
    p = train(3, tmp_path / "mpi", "stop.iterations=20", "straggler.slowdown=[1, 2]")
    assert p.returncode == 0, p.stderr
    q = local(tmp_path / "single", "stop.iterations=20", "sync.workers=2")
    assert q.returncode == 0, q.stderr
    mpi, single = summary(tmp_path / "mpi"), summary(tmp_path / "single")
    assert list(mpi) == list(single) == list(SUMMARY_KEYS)
    assert single["mpi_library"] is None and single["injected_delay_seconds"] is None
    assert mpi["mpi_library"] and len(mpi["injected_delay_seconds"]) == 2
    assert "\0" not in mpi["mpi_library"]  # Open MPI's version string ends with a NUL byte
    for s in (mpi, single):
        assert s["iterations"] == [20, 20] and len(s["compute_seconds"]) == len(s["wait_seconds"]) == 2
        assert s["train_loss"] > 0 and s["evals"][-1]["test_acc"] == s["test_accuracy"]
        assert s["evals"][-1]["version"] == s["versions"] == s["barriers"] == 20


def worker_iterations(run_dir: Path) -> dict[int, np.ndarray]:
    traces = read_run(run_dir)
    return {rank - 1: t.tables["iterations"] for rank, t in traces.items() if rank > 0}


@pytest.mark.parametrize("s", [0, 2])
def test_ssp_never_starts_an_iteration_beyond_the_staleness_bound(s, tmp_path):
    p = train(4, tmp_path, "sync.model=ssp", f"sync.staleness={s}", "stop.iterations=40", *STRAGGLER)
    assert p.returncode == 0, p.stderr
    its = worker_iterations(tmp_path)
    # iteration k of worker i starts at t_start with done_i = k; done_j(t) = pushes j posted by t (a push
    # counts from t_push, a little before it arrives, so a release inside that gap could go unseen here;
    # tests/test_sync_policies.py checks the bound exactly, event by event)
    pushes = {w: np.sort(rows["t_push"]) for w, rows in its.items()}
    for w, rows in its.items():
        for k, t in zip(rows["iteration"], rows["t_start"], strict=True):
            slowest = min(int(np.searchsorted(pushes[j], t, side="right")) for j in its)
            assert k - slowest <= s, f"worker {w} started iteration {k} while the slowest had {slowest} pushes"
    if s == 0:  # lockstep: everyone's k-th iteration starts after everyone's (k-1)-th push
        starts = np.array([its[w]["t_start"] for w in sorted(its)])
        ends = np.array([its[w]["t_push"] for w in sorted(its)])
        assert (starts[:, 1:].min(axis=0) >= ends[:, :-1].max(axis=0) - 1e-3).all()


def test_waiting_under_a_3x_straggler_bsp_ssp_asp(tmp_path):
    """With one worker 3x slower, BSP's fast workers wait most, ASP's not at all, SSP(3) in between."""
    waits, held = {}, {}
    for model in ("bsp", "ssp", "asp"):
        out = tmp_path / model
        # SSP saves its fast workers about the straggler's time for its slack (10 iterations of 30 ms),
        # 0.43 s of BSP's 0.78 s: a pause of the machine in one run, which only adds waiting, is far
        # smaller. (A slack of 3 iterations of 12 ms saved 0.06 s, and one pause in a CI run outweighed it.)
        p = train(4, out, f"sync.model={model}", "sync.staleness=10", "stop.iterations=30", *STRAGGLER[:2],
                  "straggler.base_s=0.01", "straggler.jitter_sigma=0.4")
        assert p.returncode == 0, p.stderr
        s = summary(out)
        waits[model] = float(np.mean(s["wait_seconds"][:2]))  # the two fast workers
        pulls = read_run(out)[0].tables["pulls"]
        held[model] = float((pulls["t_reply"] - pulls["t_request"]).max())
    assert waits["bsp"] > waits["ssp"] > waits["asp"]
    assert held["asp"] == 0.0  # ASP answers every pull the moment it arrives: only message latency is left
    assert held["bsp"] > 0.0


def test_nan_gradients_are_rejected_counted_and_never_applied(tmp_path):
    """One sample near float32's largest value in worker 1's shard overflows its layer's output to inf
    and poisons one push per epoch with NaN; the server drops each. (NaN or Inf in the data itself is
    refused at load time.)"""
    data = write_poisoned(tmp_path / "data.h5")
    out = tmp_path / "run"
    # 100 samples per shard, batches of 10: 10 iterations per epoch, so 2 poisoned pushes in 20 iterations
    p = train(3, out, "data.name=hdf5", f"data.path={data}", "data.normalize=false", "data.batch_size=10",
              "sync.model=asp", "stop.iterations=20", "straggler.enabled=false")
    assert p.returncode == 0, p.stderr
    s = summary(out)
    assert s["rejected_pushes"] == 2
    pushes = read_run(out)[0].tables["pushes"]
    assert pushes["rejected"].sum() == 2 and set(pushes["worker"][pushes["rejected"] == 1]) == {1}
    assert s["versions"] == 40 - 2  # ASP: one version per applied push
    tensors, _ = read_model(out / "model.h5")
    assert all(np.isfinite(t).all() for t in tensors.values())


def test_traces_hold_every_table_and_one_time_axis(tmp_path):
    p = train(3, tmp_path, "sync.model=elasticbsp", "sync.lookahead=4", "stop.iterations=30", *STRAGGLER[:1],
              "straggler.slowdown=[1, 3]", "eval.every_seconds=0.05")
    assert p.returncode == 0, p.stderr
    traces = read_run(tmp_path)
    assert sorted(traces) == [0, 1, 2]
    server = traces[0]
    assert server.attrs["role"] == "server" and server.config["sync"]["model"] == "elasticbsp"
    for table in ("pushes", "pulls", "evals", "barriers", "barrier_members", "zipline"):
        assert len(server.tables[table]) > 0, table
    s = summary(tmp_path)
    assert s["barriers"] == len(server.tables["barriers"])
    for rank in (1, 2):
        rows = traces[rank].tables["iterations"]
        assert traces[rank].attrs["role"] == "worker" and "clock_offset_s" in traces[rank].attrs
        assert len(rows) == 30 and (np.diff(rows["t_start"]) > 0).all()
        assert (rows["t_start"] <= rows["t_compute_end"]).all() and (rows["t_push"] <= rows["t_end"]).all()
        pushes = server.tables["pushes"]
        mine = pushes[pushes["worker"] == rank - 1]
        # a push arrives after the worker posted it: one time axis across ranks (clock offset applied)
        assert (mine["t"] >= rows["t_push"] - 0.005).all()
    # Whether an accuracy is reached within 30 iterations depends on when the evaluations happened to
    # run; what the outputs must say of it does not: the trace's evaluations are the summary's, the last
    # one is the final model's, and each target's time is that of the first evaluation reaching it.
    evals = server.tables["evals"]
    assert [(e["t"], e["version"], e["test_acc"]) for e in s["evals"]] == \
        [(float(t), int(v), float(a)) for t, v, a in zip(evals["t"], evals["version"], evals["test_acc"], strict=True)]
    assert s["evals"][-1]["test_acc"] == s["test_accuracy"] and s["evals"][-1]["version"] == s["versions"]
    assert list(s["time_to_accuracy"]) == ["0.9", "0.95"]
    for target, reached in s["time_to_accuracy"].items():
        first = [e["t"] for e in s["evals"] if e["test_acc"] >= float(target)]
        assert reached == (first[0] if first else None), target


@pytest.mark.mpi_impl
@pytest.mark.skipif(not Path("/proc").is_dir(), reason="finds the rank's process through /proc")
def test_kill_9_of_a_worker_ends_the_job_naming_the_rank_and_leaves_readable_traces(tmp_path):
    """Every attempt must end the job (non-zero, within stall_timeout + 10 s) with readable traces.

    Open MPI's launcher names the dead rank itself. Under MPICH the ranks must outlive the death long
    enough to speak: rank 0 names the dead rank when the launcher signals the failure (SIGUSR1), else
    the watchdog does. MPICH's Hydra now and then kills every rank before any can write a word, so the
    rank must be named in one of a few attempts (tests/mpirun.py, KILL_ATTEMPTS).
    """
    named = dead_rank_named(2, "rank 2")
    for attempt in signal_until_named(tmp_path, 2, signal.SIGKILL, 5.0, named, flags=watchdog_flags()):
        for path in sorted((attempt.run / "trace").glob("rank-*.h5")):
            with h5py.File(path, "r") as f:  # opens: nothing lost up to the last flush
                assert "rank" in f.attrs


def test_a_worker_killed_while_the_others_still_set_up_ends_the_job(tmp_path):
    """Rank 2 dies as soon as it has built its part, while the server may still be building its own:
    the survivors must not hang in the set-up collectives (they poll them, so the launcher's notice
    gets through)."""
    ended = signal_rank_mid_run(tmp_path, 2, signal.SIGKILL, 5.0, flags=watchdog_flags(), after=0.0)
    assert ended.code != 0, ended.output


@pytest.mark.parametrize("fault, message", [
    ("2:5", "rank 2 (worker 1) failed: RuntimeError: fault injected at iteration 5"),
    ("1:end", "rank 1 (worker 0) failed: RuntimeError: fault injected at the end"),  # after its last push
], ids=["mid-run", "at-the-end"])
def test_an_exception_on_a_worker_aborts_the_job_naming_the_rank(tmp_path, fault, message):
    p = train(3, tmp_path, "stop.iterations=20", "straggler.enabled=false", extra_env={"EBSP_INJECT_FAULT": fault})
    assert p.returncode != 0
    assert message in p.stderr + p.stdout


@pytest.mark.parametrize("fault, message", [
    # the silence is as measured when the watchdog looked: 3.0 s, or a little more on a loaded machine
    ("1:5:hang", r"worker rank 1 silent for 3\.\d s \(runtime\.stall_timeout_s = 3\.0\)"),
    # the end of a run is polled too: a worker stuck before it reports its statistics must not hang
    # the server (it used to wait in a blocking gather)
    ("2:end:hang", r"worker rank 2 sent no statistics within 3\.0 s"),
], ids=["mid-run", "at-the-end"])
def test_the_watchdog_names_a_hung_worker(tmp_path, fault, message):
    t0 = time.monotonic()
    p = train(3, tmp_path, "stop.iterations=20", "straggler.enabled=false", "runtime.stall_timeout_s=3",
              extra_env={"EBSP_INJECT_FAULT": fault}, timeout=60)
    assert p.returncode != 0
    assert re.search(message, p.stderr + p.stdout), p.stderr + p.stdout
    assert time.monotonic() - t0 < 3 + 30  # well before the launcher's own timeout
    if fault.endswith("end:hang"):  # training had finished: the model is kept
        state, attrs = read_model(tmp_path / "model.h5")
        assert attrs["version"] == 20 and state


def test_a_worker_that_finishes_long_before_the_others_waits_for_the_end(tmp_path):
    """ASP to a number of iterations, worker 1 five times slower: worker 0 stops seconds before it, more
    than the stall timeout, and waits for the end hearing the server's keep-alives. Without them it
    took the server for dead and aborted the job, naming it (alive) silent."""
    p = train(3, tmp_path, "sync.model=asp", "stop.iterations=100", "runtime.stall_timeout_s=2",
              "straggler.base_s=0.01", "straggler.slowdown=[1.0, 5.0]", timeout=120)
    assert p.returncode == 0, p.stderr + p.stdout
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["iterations"] == [100, 100]
    ends = [np.max(read_run(tmp_path)[rank].table("iterations")["t_end"]) for rank in (1, 2)]
    assert ends[1] - ends[0] > 2 * 2, ends  # worker 0 waited longer than two stall timeouts
