"""Sharded parameter servers (``runtime.servers = k``; docs/design.md, "Sharded servers").

The shard plan is pure and checked against brute force; the runs check the promises: BSP with k
servers equals the single-process oracle and BSP with one server, every other sync model trains,
SSP's bound holds, a bad push is applied on no shard, and a stopped or killed server is named.
Each launch carries a timeout.
"""

import itertools
import json
import signal
from pathlib import Path

import numpy as np
import pytest

from ebsp_mpi.outputs import read_model
from ebsp_mpi.runtime.transport.protocol import owner_of_chunks, plan_chunks, plan_shards
from ebsp_mpi.trace import read_run
from datafiles import write_poisoned
from mpirun import (dead_rank_named, max_abs_difference, oracle_run, resume, signal_until_named, train,
                    watchdog_flags)

ORACLE = ["sync.model=bsp", "stop.iterations=40", "optim.momentum=0.9", "optim.weight_decay=5e-4",
          "straggler.enabled=false"]
STRAGGLER = ["straggler.slowdown=[1, 1, 3]", "straggler.base_s=0.004", "straggler.jitter_sigma=0.1"]


def summary(run_dir: Path) -> dict:
    return json.loads((run_dir / "summary.json").read_text())


# -- the shard plan (pure) ------------------------------------------------------------------------------


def brute_force_largest_shard(sizes: list[int], servers: int, together=()) -> int:
    """The smallest possible largest shard over every contiguous cut into `servers` non-empty shards
    that keeps each run of `together` on one server."""
    best = None
    for cuts in itertools.combinations(range(1, len(sizes)), servers - 1):
        if any(run[0] < c <= run[-1] for c in cuts for run in together):
            continue
        bounds = (0, *cuts, len(sizes))
        largest = max(sum(sizes[a:b]) for a, b in itertools.pairwise(bounds))
        best = largest if best is None else min(best, largest)
    return best


@pytest.mark.parametrize("seed", range(40))
def test_shards_are_contiguous_cover_every_chunk_and_have_the_smallest_largest_shard(seed):
    rng = np.random.default_rng(seed)
    bounds, offset = [], 0
    for _ in range(rng.integers(2, 7)):
        size = int(rng.integers(1, 5000))
        bounds.append((offset, size))
        offset += size
    chunks = plan_chunks(bounds, 4, int(rng.choice([1024, 4096, 16384])))
    servers = int(rng.integers(1, min(5, len(chunks)) + 1))
    together = []
    if len(chunks) > 3 and rng.random() < 0.5:  # one run of chunks that must stay together
        first = int(rng.integers(0, len(chunks) - 2))
        together = [list(range(first, first + 2))]
    if brute_force_largest_shard([c.size for c in chunks], servers, together) is None:
        pytest.skip("no cut keeps the run together")
    shards = plan_shards(chunks, servers, together)
    assert [s.server for s in shards] == list(range(servers))
    assert shards[0].first == 0 and shards[-1].stop == len(chunks)
    assert all(a.stop == b.first and a.hi == b.lo for a, b in itertools.pairwise(shards))
    assert all(s.stop > s.first for s in shards)  # no server without a chunk
    owner = owner_of_chunks(shards)
    assert all(len({owner[k] for k in run}) == 1 for run in together)
    assert max(s.size for s in shards) == brute_force_largest_shard([c.size for c in chunks], servers, together)


def test_more_servers_than_messages_is_an_error_that_says_what_to_change():
    chunks = plan_chunks([(0, 10), (10, 10)], 4, 4096)
    with pytest.raises(ValueError, match=r"2 messages per push cannot be dealt to 3 servers; lower runtime\.servers"):
        plan_shards(chunks, 3)


# -- runs -----------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def oracle(tmp_path_factory) -> Path:
    """The single-process oracle of ``ORACLE`` with 3 workers (how the weights travel does not change
    it), run once for every wire."""
    return oracle_run(tmp_path_factory, "sync.workers=3", *ORACLE)


@pytest.mark.parametrize("wire", [pytest.param(["runtime.chunk_bytes=4096"], marks=pytest.mark.mpi_impl),
                                  ["runtime.chunk_bytes=4096", "runtime.stream_rounds=true"],
                                  ["comm.hybrid=sfb"]], ids=["ps", "ps-streamed", "sfb"])
def test_bsp_with_two_servers_equals_the_oracle_and_bsp_with_one_server(wire, oracle, tmp_path):
    """The release rule (docs/design.md, "Sharded servers"): under BSP every server answers with exactly
    the round, so BSP with k servers equals BSP with one (and the oracle) up to float summation order."""
    p = train(5, tmp_path / "two", "runtime.servers=2", *wire, *ORACLE, timeout=180)
    assert p.returncode == 0, p.stderr
    q = train(4, tmp_path / "one", *wire, *ORACLE, timeout=180)
    assert q.returncode == 0, q.stderr
    assert max_abs_difference(tmp_path / "two", oracle) <= 1e-5
    assert max_abs_difference(tmp_path / "two", tmp_path / "one") <= 1e-5
    s = summary(tmp_path / "two")
    assert s["workers"] == 3 and s["world_size"] == 5 and s["iterations"] == [40, 40, 40]
    assert len(s["bytes"]) == 5  # per rank: two servers, three workers
    traces = read_run(tmp_path / "two")
    assert [traces[r].role for r in range(5)] == ["server", "server", "worker", "worker", "worker"]
    shards = [traces[r].attrs["shards"] for r in (0, 1)]
    assert shards[0] == shards[1] and len(shards[0]) == 2 and shards[0][0][1] == shards[0][1][0]


@pytest.mark.parametrize("model", ["asp", "ssp", "dssp", "elasticbsp", "psp"])
def test_every_sync_model_trains_the_digits_mlp_with_two_servers(model, tmp_path):
    p = train(5, tmp_path, f"sync.model={model}", "runtime.servers=2", "stop.iterations=150", *STRAGGLER[:2],
              timeout=240)
    assert p.returncode == 0, p.stderr
    s = summary(tmp_path)
    assert s["test_accuracy"] >= 0.95, s["test_accuracy"]
    assert s["iterations"] == [150, 150, 150] and s["rejected_pushes"] == 0


def test_ssp_with_two_servers_never_starts_an_iteration_beyond_the_staleness_bound(tmp_path):
    bound = 2
    p = train(5, tmp_path, "sync.model=ssp", f"sync.staleness={bound}", "runtime.servers=2", "stop.iterations=40",
              *STRAGGLER, timeout=180)
    assert p.returncode == 0, p.stderr
    traces = read_run(tmp_path)
    its = {t.attrs["rank"] - 2: t.tables["iterations"] for t in traces.values() if t.role == "worker"}
    assert sorted(its) == [0, 1, 2]
    pushes = {w: np.sort(rows["t_push"]) for w, rows in its.items()}
    for w, rows in its.items():
        for k, t in zip(rows["iteration"], rows["t_start"], strict=True):
            slowest = min(int(np.searchsorted(pushes[j], t, side="right")) for j in its)
            assert k - slowest <= bound, f"worker {w} started iteration {k} while the slowest had {slowest} pushes"
    # the analysis knows where the workers start: ranks 2..4 are workers 0..2
    pytest.importorskip("pandas")
    from ebsp_mpi.analysis.perfetto import trace_events
    from ebsp_mpi.trace.frames import load_run

    frames = load_run(tmp_path)
    assert frames.workers == 3 and sorted(set(frames.tables["iterations"]["worker"])) == [0, 1, 2]
    names = {e["pid"]: e["args"]["name"] for e in trace_events(tmp_path)["traceEvents"] if e["name"] == "process_name"}
    assert names[1] == "rank 1: server 1 (a shard)"
    assert names[2] == "rank 2: worker 0" and names[4] == "rank 4: worker 2"


def test_a_bad_push_is_applied_on_no_shard_and_counted_once(tmp_path):
    """A sample near float32's largest value in worker 1's shard poisons one push per epoch: the
    worker's header says so, and every server drops it (as with one server)."""
    data = write_poisoned(tmp_path / "data.h5")
    out = tmp_path / "run"
    p = train(4, out, "runtime.servers=2", "data.name=hdf5", f"data.path={data}", "data.normalize=false",
              "data.batch_size=10", "sync.model=asp", "stop.iterations=20", "straggler.enabled=false")
    assert p.returncode == 0, p.stderr
    s = summary(out)
    assert s["rejected_pushes"] == 2 and s["versions"] == 40 - 2
    tensors, _ = read_model(out / "model.h5")
    assert all(np.isfinite(t).all() for t in tensors.values())


@pytest.mark.skipif(not Path("/proc").is_dir(), reason="finds the rank's process through /proc")
@pytest.mark.parametrize("sig, cleanup, named", [
    (signal.SIGSTOP, False, "rank 1"),
    (signal.SIGKILL, True, "rank 1 (server 1, pid"),
], ids=["server 1 stopped", "server 1 killed, no auto-cleanup"])
def test_a_stopped_or_killed_server_rank_ends_the_job_and_is_named(sig, cleanup, named, tmp_path):
    flags = watchdog_flags() if cleanup else []
    if sig == signal.SIGKILL:
        named = dead_rank_named(1, named)
    output = signal_until_named(tmp_path, 1, sig, 4.0, named, "sync.model=ssp", "runtime.servers=2",
                                flags=flags, ranks=4)[-1].output
    if sig == signal.SIGSTOP:  # rank 0 or a worker noticed the silence, and said whose
        assert "server rank 1 silent" in output or "the server 1 (rank 1) sent nothing" in output, output[-3000:]


@pytest.mark.parametrize("fault, message", [
    ("1:30", "rank 1 (server 1) failed: RuntimeError: fault injected at push 30"),
    ("1:30:hang", "rank 1"),  # rank 0 or a worker names the silent server
], ids=["raise", "hang"])
def test_a_failing_shard_server_ends_the_job_and_is_named(fault, message, tmp_path):
    p = train(4, tmp_path, "runtime.servers=2", "stop.iterations=40", "straggler.enabled=false",
              "runtime.stall_timeout_s=3", extra_env={"EBSP_INJECT_FAULT": fault}, timeout=60)
    assert p.returncode != 0
    assert message in p.stderr + p.stdout, p.stderr
    if fault.endswith("hang"):
        assert "server rank 1 silent" in p.stderr or "the server 1 (rank 1) sent nothing" in p.stderr, p.stderr


def test_too_few_ranks_for_the_servers_is_one_line_and_exit_2(tmp_path):
    p = train(2, tmp_path / "run", "runtime.servers=2", timeout=60)
    assert p.returncode == 2
    assert "runtime.servers = 2: this launch has 2 ranks, which leaves no worker" in p.stderr
    assert len(p.stderr.strip().splitlines()) == 1, p.stderr


def test_a_run_with_two_servers_resumes_from_its_checkpoint_exactly(tmp_path):
    """Each server reads its own shard of checkpoint.h5: 40 iterations, then 40 more from the
    checkpoint, equal 80 in one go (BSP)."""
    first = train(5, tmp_path / "resumed", "runtime.servers=2", *ORACLE, timeout=180)
    assert first.returncode == 0, first.stderr
    resumed = resume(5, tmp_path / "resumed", "stop.iterations=80", timeout=180)
    assert resumed.returncode == 0, resumed.stderr
    whole = [o for o in ORACLE if not o.startswith("stop.")]
    p = train(5, tmp_path / "whole", "runtime.servers=2", *whole, "stop.iterations=80", timeout=180)
    assert p.returncode == 0, p.stderr
    assert max_abs_difference(tmp_path / "resumed", tmp_path / "whole") <= 1e-5
