"""HDF5 trace writer and reader: round trips, growth across flushes, crash safety, damaged files."""

import json
import os
import re
import subprocess
import sys
import textwrap
import warnings

import h5py
import numpy as np
import pytest

from ebsp_mpi.trace import TABLES, TraceError, TraceWriter, read_run, read_trace, trace_path
from ebsp_mpi.trace.reader import read_summary
from ebsp_mpi.trace.schema import SERVER_TABLES, WORKER_TABLES


def random_rows(dtype: np.dtype, n: int, rng: np.random.Generator) -> np.ndarray:
    rows = np.zeros(n, dtype=dtype)
    for name in dtype.names:
        kind = dtype[name].kind
        if kind == "f":
            rows[name] = rng.standard_normal(n) * 100
        elif kind == "u":
            rows[name] = rng.integers(0, 2, n)
        else:
            rows[name] = rng.integers(-(2**31), 2**31 - 1, n)
    return rows


ATTRS = {
    "run_id": "run-42",
    "rank": 0,
    "role": "server",
    "world_size": 4,
    "host": "node-a",
    "backend": "numpy",
    "device": None,
    "package_version": "0.1.0",
    "config": {"sync": {"model": "elastic", "lookahead": 5}, "stragglers": {"slowdown": [1.0, 3.0]}},
}


def test_trace_path_names_rank_file(tmp_path):
    assert trace_path(tmp_path, 3) == tmp_path / "trace" / "rank-0003.h5"
    assert trace_path("out", 12345).name == "rank-12345.h5"
    with pytest.raises(ValueError, match="rank"):
        trace_path(tmp_path, -1)


def test_round_trip_every_table_and_attrs(tmp_path):
    rng = np.random.default_rng(0)
    path = trace_path(tmp_path, 0)
    expected = {name: random_rows(dt, 7, rng) for name, dt in TABLES.items()}
    with TraceWriter(path, ATTRS) as writer:
        for name, rows in expected.items():
            for k, row in enumerate(rows):
                if k % 2:  # both call forms
                    writer.append(name, row.item())
                else:
                    writer.append(name, **{f: row[f] for f in rows.dtype.names})
        writer.set_attrs(clock_offset_s=-0.125)

    trace = read_trace(path)
    assert set(trace.tables) == set(TABLES)
    for name, rows in expected.items():
        got = trace.tables[name]
        assert got.dtype == TABLES[name]
        np.testing.assert_array_equal(got, rows)
    assert trace.config == ATTRS["config"]
    assert trace.attrs["config"] == ATTRS["config"]
    for key in ("run_id", "rank", "role", "world_size", "host", "backend", "device", "package_version"):
        assert trace.attrs[key] == ATTRS[key]
    assert trace.attrs["clock_offset_s"] == -0.125
    assert trace.rank == 0 and trace.role == "server"
    assert trace.attrs["trace_schema_version"] >= 1
    with h5py.File(path, "r") as h5:  # stored as the JSON attribute schema.py names
        assert "config_json" in h5.attrs and "config" not in h5.attrs


def test_tables_are_chunked_resizable_and_a_full_buffer_is_flushed_not_grown(tmp_path):
    path = tmp_path / "w.h5"
    rows = random_rows(TABLES["iterations"], 3000, np.random.default_rng(1))
    # Batches larger than the buffer flush it when full; flushes in between extend the dataset.
    batches = [rows[:5], rows[5:1205], rows[1205:1206], rows[1206:]]
    with TraceWriter(path, {"rank": 1, "role": "worker"}, flush_seconds=1e9) as writer:
        buffer = writer._buffers["iterations"].rows
        for batch in batches:
            for row in batch:
                writer.append("iterations", row.item())
            assert writer.pending("iterations") == len(batch) % len(buffer)
            assert writer.maybe_flush() is False  # the interval has not passed
            writer.flush()
            assert writer.pending("iterations") == 0
        assert writer._buffers["iterations"].rows is buffer  # the memory a trace holds never grows
    with h5py.File(path, "r") as h5:
        ds = h5["iterations"]
        assert ds.maxshape == (None,) and ds.chunks is not None
        assert set(h5) == {"iterations"}  # tables never used are not created
    trace = read_trace(path)
    np.testing.assert_array_equal(trace.tables["iterations"], rows)
    assert trace.table("pushes").dtype == TABLES["pushes"] and len(trace.table("pushes")) == 0


def test_maybe_flush_writes_once_interval_passed(tmp_path):
    path = tmp_path / "m.h5"
    writer = TraceWriter(path, {"rank": 0}, flush_seconds=0.0)
    writer.append("zipline", (1.0, 8, 5, 1e-4))
    assert writer.maybe_flush() is True
    assert writer.pending("zipline") == 0
    trace = read_trace(path, live=True)  # the writer still holds the file
    assert len(trace.tables["zipline"]) == 1
    writer.close()


def test_close_is_idempotent_and_final(tmp_path):
    path = tmp_path / "c.h5"
    writer = TraceWriter(path, {"rank": 0})
    writer.append("evals", t=1.0, version=3, test_loss=0.5, test_acc=0.9, seconds=0.01)
    writer.close()
    writer.close()
    writer.flush()  # no-op once closed
    assert writer.closed
    with pytest.raises(ValueError, match="closed"):
        writer.append("evals", (2.0, 4, 0.4, 0.91, 0.01))
    assert len(read_trace(path).tables["evals"]) == 1


def test_append_rejects_bad_rows(tmp_path):
    with TraceWriter(tmp_path / "b.h5", {"rank": 0}) as writer:
        with pytest.raises(ValueError, match="unknown trace table 'nope'"):
            writer.append("nope", (1,))
        with pytest.raises(ValueError, match="missing field 't_reply'"):
            writer.append("pulls", worker=1, t_request=0.0, version=2)
        with pytest.raises(ValueError, match=r"unknown fields \['extra'\]"):
            writer.append("pulls", worker=1, t_request=0.0, t_reply=0.1, version=2, extra=5)
        with pytest.raises(TypeError):
            writer.append("pulls", (1, 0.0, 0.1, 2), worker=1)
        with pytest.raises(TypeError, match="'bad'"):
            writer.set_attrs(bad=object())
        assert writer.pending("pulls") == 0


def test_tables_by_role_cover_schema():
    assert set(WORKER_TABLES) | set(SERVER_TABLES) == set(TABLES)


CHILD = textwrap.dedent(
    """
    import os, signal, sys
    from ebsp_mpi.trace import TraceWriter
    path, mode = sys.argv[1], sys.argv[2]
    w = TraceWriter(path, {"rank": 1, "role": "worker", "config": {"a": {"b": 1}}}, flush_seconds=1e9)
    if mode == "flushed":
        for i in range(1000):
            w.append("iterations", (i, 0.0, 0.1, 0.2, 0.3, 0.1, i, 1.5, 0.0, i / 100))
        w.flush()
        print("flushed", flush=True)
        sys.stdin.readline()  # the parent reads the live file meanwhile
        for i in range(1000, 1500):  # buffered only: lost with the process
            w.append("iterations", (i, 0.0, 0.1, 0.2, 0.3, 0.1, i, 1.5, 0.0, i / 100))
        w.set_attrs(clock_offset_s=0.5)
    os.kill(os.getpid(), signal.SIGKILL)
    """
)


@pytest.mark.parametrize("mode", ["flushed", "before-first-flush"])
def test_file_readable_after_sigkill(tmp_path, mode):
    path = tmp_path / "trace" / "rank-0001.h5"
    child = subprocess.Popen(
        [sys.executable, "-c", CHILD, str(path), mode],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        if mode == "flushed":
            assert child.stdout.readline().strip() == "flushed"
            live = read_trace(path, live=True)
            assert len(live.tables["iterations"]) == 1000
            child.stdin.write("go\n")
            child.stdin.flush()
        assert child.wait(timeout=60) == -9  # really SIGKILLed, no cleanup ran
    finally:
        if child.poll() is None:
            child.kill()

    trace = read_trace(path)
    assert trace.config == {"a": {"b": 1}}
    assert "clock_offset_s" not in trace.attrs  # set after the last flush
    if mode == "flushed":
        rows = trace.tables["iterations"]
        np.testing.assert_array_equal(rows["iteration"], np.arange(1000))
        np.testing.assert_array_equal(rows["version"], np.arange(1000))
    else:
        assert trace.tables == {}


def write_run(run_dir, ranks):
    for rank in ranks:
        with TraceWriter(trace_path(run_dir, rank), {"rank": rank}) as writer:
            writer.append("zipline", (float(rank), 2, 3, 0.001))


def test_read_run_returns_every_rank(tmp_path):
    write_run(tmp_path, [0, 1, 2])
    (tmp_path / "trace" / "notes.txt").write_text("ignored")
    traces = read_run(tmp_path)
    assert sorted(traces) == [0, 1, 2]
    assert all(traces[r].rank == r for r in traces)
    assert traces[2].tables["zipline"]["t"][0] == 2.0


@pytest.mark.parametrize("damage", ["truncate", "garbage", "empty"])
def test_read_run_skips_damaged_file_with_warning(tmp_path, damage):
    write_run(tmp_path, [0, 1, 2])
    bad = trace_path(tmp_path, 1)
    if damage == "truncate":
        os.truncate(bad, os.path.getsize(bad) // 2)
    elif damage == "garbage":
        bad.write_bytes(b"not an hdf5 file" * 100)
    else:
        bad.write_bytes(b"")
    with pytest.warns(UserWarning, match=re.escape("rank-0001.h5")) as caught:
        traces = read_run(tmp_path)
    assert sorted(traces) == [0, 2]
    assert len(caught) == 1
    with pytest.raises(TraceError, match=re.escape("rank-0001.h5")):
        read_trace(bad)


def test_read_run_errors_name_the_path(tmp_path):
    missing = tmp_path / "no-such-run"
    with pytest.raises(TraceError, match="no-such-run"):
        read_run(missing)
    with pytest.raises(TraceError, match="no trace directory"):
        read_run(tmp_path)
    (tmp_path / "trace").mkdir()
    with pytest.raises(TraceError, match="no trace files"):
        read_run(tmp_path)
    only = trace_path(tmp_path, 0)
    only.write_bytes(b"\0" * 64)
    with pytest.warns(UserWarning), pytest.raises(TraceError, match="no readable trace file"):
        read_run(tmp_path)
    with pytest.raises(TraceError, match="not found"):
        read_trace(tmp_path / "trace" / "rank-0009.h5")


# -- rank files of another run, and summary.json ----------------------------------------------------


def write_ranks(run_dir, run_ids: dict):
    """One file per rank with the given run id (None: no run_id attribute, as in a foreign HDF5 file)."""
    for rank, run_id in run_ids.items():
        attrs = {"rank": rank} if run_id is None else {"rank": rank, "run_id": run_id}
        with TraceWriter(trace_path(run_dir, rank), attrs) as writer:
            writer.append("zipline", (float(rank), 2, 3, 0.001))


def test_read_run_leaves_out_a_rank_file_of_another_run_naming_both_run_ids(tmp_path):
    write_ranks(tmp_path, {0: "run-a", 1: "run-a", 2: "run-b", 3: None})
    with pytest.warns(UserWarning) as caught:
        traces = read_run(tmp_path)
    assert sorted(traces) == [0, 1]
    text = [str(w.message) for w in caught]
    assert len(text) == 2
    assert "rank-0002.h5" in text[0] and "'run-b'" in text[0] and "'run-a'" in text[0] and "rank-0000.h5" in text[0]
    assert "rank-0003.h5" in text[1] and "None" in text[1]


def test_read_run_takes_the_run_id_from_the_summary_where_it_has_one(tmp_path):
    # rank 0 itself is the stranger here: the summary names the run that finished in this directory
    write_ranks(tmp_path, {0: "run-b", 1: "run-a", 2: "run-a"})
    (tmp_path / "summary.json").write_text('{"run_id": "run-a", "wall_seconds": 1.0}')
    with pytest.warns(UserWarning, match=r"rank-0000.h5.*'run-b'.*'run-a'.*summary.json"):
        traces = read_run(tmp_path)
    assert sorted(traces) == [1, 2]


def test_read_run_without_rank_0_takes_the_run_id_most_files_carry(tmp_path):
    write_ranks(tmp_path, {1: "run-b", 2: "run-a", 3: "run-a"})
    with pytest.warns(UserWarning, match=r"rank-0001.h5.*'run-b'.*'run-a'.*2 of the 3"):
        traces = read_run(tmp_path)
    assert sorted(traces) == [2, 3]


def test_read_run_leaves_out_a_file_that_holds_another_ranks_trace(tmp_path):
    write_ranks(tmp_path, {0: "run-a", 1: "run-a", 2: "run-a"})
    trace_path(tmp_path, 2).write_bytes(trace_path(tmp_path, 1).read_bytes())  # rank 1's, renamed
    with pytest.warns(UserWarning, match=r"rank-0002.h5: it holds rank 1's trace"):
        traces = read_run(tmp_path)
    assert sorted(traces) == [0, 1]


def test_read_run_of_files_that_agree_gives_no_warning(tmp_path):
    write_ranks(tmp_path, {0: "run-a", 1: "run-a"})
    (tmp_path / "summary.json").write_text('{"run_id": "run-a", "wall_seconds": 1.0}')
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert sorted(read_run(tmp_path)) == [0, 1]


@pytest.mark.parametrize("text, problem", [
    (None, "summary.json: missing"),
    ("{not json", "summary.json: unreadable"),
    ("[1, 2]", "not a JSON object but list"),
    ('{"wall_seconds": "fast"}', "'wall_seconds' is \"fast\", expected a number or null"),
    ('{"wall_seconds": 1.0, "workers": true}', "'workers' is true, expected an integer or null"),
    ('{"wall_seconds": 1.0, "config": "x"}', "'config' is \"x\", expected an object or null"),
    ('{"wall_seconds": 1.0, "time_to_accuracy": {"high": 1.0}}', "the target 'high'"),
    ('{"wall_seconds": 1.0, "time_to_accuracy": {"0.9": "soon"}}', "'time_to_accuracy' of 0.9 is \"soon\""),
    ('{"wall_seconds": null, "sync": "bsp"}', "wall_seconds is null or missing): the run did not finish"),
    ('{"sync": "bsp"}', "the run did not finish"),
])
def test_read_summary_names_what_is_wrong(tmp_path, text, problem):
    if text is not None:
        (tmp_path / "summary.json").write_text(text)
    summary, found = read_summary(tmp_path)
    assert found is not None and problem in found and str(tmp_path / "summary.json") in found
    # an unfinished run's summary still names its job; a malformed one is not trusted at all
    assert summary == ({"wall_seconds": None, "sync": "bsp"} if "null" in (text or "") else
                       {"sync": "bsp"} if text == '{"sync": "bsp"}' else {})


def test_read_summary_of_a_finished_run(tmp_path):
    doc = {"wall_seconds": 2.5, "test_accuracy": None, "time_to_accuracy": {"0.9": None, "0.95": 1.5}}
    (tmp_path / "summary.json").write_text(json.dumps(doc))
    assert read_summary(tmp_path) == (doc, None)  # a diverged run (null accuracy) did finish
    (tmp_path / "summary.json").unlink()
    (tmp_path / "summary.json").mkdir()
    assert "summary.json: not a file" in read_summary(tmp_path)[1]


def test_a_table_of_another_schema_makes_the_file_unreadable_by_name(tmp_path):
    write_ranks(tmp_path, {0: "run-a", 1: "run-a"})
    with h5py.File(trace_path(tmp_path, 1), "r+") as h5:  # a table of the same name but another layout
        del h5["zipline"]
        h5["zipline"] = np.arange(10)
    with pytest.raises(TraceError, match=r"rank-0001.h5: table 'zipline' is not one of this trace schema"):
        read_trace(trace_path(tmp_path, 1))
    with pytest.warns(UserWarning, match=re.escape("rank-0001.h5")):
        assert sorted(read_run(tmp_path)) == [0]


def test_two_names_for_one_rank_read_the_writers_name_only(tmp_path):
    write_ranks(tmp_path, {0: "run-a", 1: "run-a", 2: "run-a"})
    (tmp_path / "trace" / "rank-1.h5").write_bytes(trace_path(tmp_path, 2).read_bytes())
    with pytest.warns(UserWarning, match=r"leaving out .*rank-1.h5: rank-0001.h5 is rank 1's file"):
        traces = read_run(tmp_path)
    assert traces[1].path.name == "rank-0001.h5" and traces[1].tables["zipline"]["t"][0] == 1.0


@pytest.mark.parametrize("value, size", [(5, 5), ("five", 0), (True, 0), (-1, 0)])
def test_world_size_is_an_integer_or_0(tmp_path, value, size):
    with TraceWriter(trace_path(tmp_path, 0), {"rank": 0, "world_size": value}):
        pass
    assert read_trace(trace_path(tmp_path, 0)).world_size == size


def test_a_writer_holds_no_more_memory_after_many_flushes(tmp_path):
    """What a rank holds for its trace must not grow with the run (an OSDP worker's measured peak counts
    it): 600 flushes of 20 rows leave the traced memory where 300 left it. h5py's high-level writes
    left some 150 bytes of cyclic garbage per flush, which only a full collection frees."""
    import tracemalloc

    writer = TraceWriter(tmp_path / "m.h5", {"rank": 1, "role": "worker"}, flush_seconds=1e9)
    row = random_rows(TABLES["iterations"], 1, np.random.default_rng(2))[0].item()

    def flushes(n: int) -> None:
        for _ in range(n):
            for _ in range(20):
                writer.append("iterations", row)
            writer.flush()

    flushes(50)  # h5py's caches, filled once
    tracemalloc.start()
    try:
        flushes(300)
        held = tracemalloc.get_traced_memory()[0]
        flushes(300)
        grown = tracemalloc.get_traced_memory()[0] - held
    finally:
        tracemalloc.stop()
        writer.close()
    assert grown < 4096, f"{grown} bytes more after 300 more flushes"


def test_a_continued_trace_drops_the_rows_beyond_its_checkpoint_and_appends_after_them(tmp_path):
    """A resumed run reopens its rank files (append=True), truncates each table at the checkpoint and
    writes on: the kept rows, then the new ones, nothing else."""
    rows = random_rows(TABLES["pushes"], 300, np.random.default_rng(3))
    rows["t"] = np.arange(300, dtype=float)
    with TraceWriter(tmp_path / "r.h5", {"rank": 0}, flush_seconds=1e9) as writer:
        for row in rows[:200]:
            writer.append("pushes", row.item())
    with TraceWriter(tmp_path / "r.h5", {"rank": 0}, flush_seconds=1e9, append=True) as writer:
        assert writer.truncate("pushes", "t", 149.5) == 150
        for row in rows[150:]:
            writer.append("pushes", row.item())
    np.testing.assert_array_equal(read_trace(tmp_path / "r.h5").tables["pushes"], rows)


def test_rows_a_kill_kept_from_the_file_are_recorded_as_lost_on_resume(tmp_path):
    """A worker's rows up to iteration 5 reached the file, but the checkpoint counted 9 iterations: the
    resume records 6-8 as lost (twice resumed: both gaps), and the reader names them, never a silent gap."""
    pytest.importorskip("pandas")
    from ebsp_mpi.trace.frames import load_run, lost_iterations

    path = trace_path(tmp_path, 1)
    attrs = {"rank": 1, "role": "worker", "world_size": 2}
    rows = random_rows(TABLES["iterations"], 20, np.random.default_rng(4))
    rows["iteration"] = np.arange(20)
    with TraceWriter(path, attrs, flush_seconds=1e9) as writer:
        for row in rows[:6]:
            writer.append("iterations", row.item())
    with TraceWriter(path, attrs, flush_seconds=1e9, append=True) as writer:
        writer.truncate("iterations", "iteration", 8)
        assert writer.mark_lost("iterations", "iteration", 9) == (6, 8)
        for row in rows[9:12]:
            writer.append("iterations", row.item())
    with TraceWriter(path, attrs, flush_seconds=1e9, append=True) as writer:  # resumed at 11: nothing lost
        writer.truncate("iterations", "iteration", 10)
        assert writer.mark_lost("iterations", "iteration", 11) is None
    with TraceWriter(path, attrs, flush_seconds=1e9, append=True) as writer:  # resumed at 14: 11-13 lost
        writer.truncate("iterations", "iteration", 13)
        assert writer.mark_lost("iterations", "iteration", 14) == (11, 13)
    trace = read_trace(path)
    assert trace.tables["iterations"]["iteration"].tolist() == [0, 1, 2, 3, 4, 5, 9, 10]
    assert trace.attrs["lost_iterations"] == [[6, 8], [11, 13]]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        problems = load_run(tmp_path).problems
    assert [p for p in problems if "have no rows" in p] == [
        (f"{path}: iterations 6-8 have no rows: the run was killed after its checkpoint counted them and before "
         "this rank wrote them (the model has their work)"),
        (f"{path}: iterations 11-13 have no rows: the run was killed after its checkpoint counted them and before "
         "this rank wrote them (the model has their work)")]
    # compare names them from the attributes alone (ebsp_mpi.analysis.cli.run_compare)
    assert lost_iterations(tmp_path) == [p for p in problems if "have no rows" in p]
