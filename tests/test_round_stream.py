"""BSP rounds streamed chunk by chunk (``runtime.servers.round_stream``): the bookkeeping on a stand-in shard
whose sends are recorded, and end to end, a round redone after a rejected push."""

import json
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from ebsp_mpi.nn.average import round_mean
from ebsp_mpi.nn.optim import SGD
from ebsp_mpi.nn.shard_update import ShardUpdate
from ebsp_mpi.nn.staleness import StalenessRule
from ebsp_mpi.outputs import read_model
from ebsp_mpi.runtime.servers.round_stream import RoundStream, streams
from ebsp_mpi.runtime.transport.protocol import CHUNK_TAG0, Chunk, ProtocolError
from ebsp_mpi.trace import read_run
from datafiles import write_poisoned
from mpirun import train

CHUNKS = [Chunk(0, 4, CHUNK_TAG0), Chunk(4, 10, CHUNK_TAG0 + 1), Chunk(10, 12, CHUNK_TAG0 + 2)]


class _Comm:
    """Records every send: (worker rank, tag, the values sent)."""

    def __init__(self):
        self.sent = []

    def Isend(self, buf, rank, tag):
        self.sent.append((rank, tag, np.array(buf[0])))
        return None


def _store(n=3, momentum=0.9):
    rng = np.random.default_rng(0)
    params = rng.normal(size=12).astype(np.float32)
    comm = _Comm()
    update = ShardUpdate(params, SGD(12, momentum=momentum), lambda v: 0.1, StalenessRule(), round_based=True)
    store = SimpleNamespace(
        n=n, pushed_chunks=CHUNKS, params=params, opt=update.opt, update=update,
        grads=[rng.normal(size=12).astype(np.float32) for _ in range(n)], sfb=[], factors=None,
        fetched=set(), ctx=SimpleNamespace(comm=comm, worker_rank=lambda w: w + 1), counted=[],
    )
    store.count_sent = lambda c, k: store.counted.append((c.tag, k))
    return store, comm


def _one_step(params, grads, members, momentum=0.9):
    """The round applied once on `members`, over the whole buffer (the oracle's arithmetic)."""
    opt, p = SGD(12, momentum=momentum), params.copy()
    opt.step(p, round_mean([grads[w] for w in members], np.empty(12, np.float32)), 0.1)
    return p, opt.velocity


def _opened(store, version: int) -> RoundStream:
    """A stream whose next round holds the stand-in shard's three workers, none stopping."""
    stream = RoundStream(store, version=version)
    for w in range(3):
        stream.expect(w, last=False)
    return stream


def _round(stream, store, pushes, headers):
    """Every worker pushes chunks in `pushes` order ((worker, chunk) pairs), then `headers` (worker,
    finite) arrive; streamed chunks are applied as they become ready."""
    for _w, j in pushes:
        stream.chunk_in(j)
        stream.apply_ready(lambda: None)
    for w, finite in headers:
        stream.header_in(w, finite)
        stream.push_in(w)


def test_a_chunk_goes_out_once_every_worker_of_the_round_has_pushed_it():
    store, comm = _store()
    before = store.params.copy()
    stream = _opened(store, version=0)
    stream.chunk_in(1)
    stream.chunk_in(1)
    assert not stream.apply_ready(lambda: None) and comm.sent == []  # two of three workers' chunk 1
    settled = []
    stream.chunk_in(1)
    assert stream.apply_ready(lambda: settled.append(1)) and settled == [1] and stream.open
    assert sorted((rank, tag) for rank, tag, _ in comm.sent) == [(1, 101), (2, 101), (3, 101)]
    # the stop reply's copy shows the weights before the round, the chunk's old values included
    np.testing.assert_array_equal(stream.before_round(store.params, stream.undo_params, 0, 12), before)
    for j in (0, 2):
        for _ in range(3):
            stream.chunk_in(j)
    for w in range(3):
        stream.header_in(w, True)
        stream.push_in(w)
    closed = stream.close((0, 1, 2), 0, lambda: None, None, None)
    assert not closed.redo and sorted(closed.sends) == [0, 1, 2] and not stream.open
    p, v = _one_step(before, store.grads, [0, 1, 2])
    np.testing.assert_array_equal(store.params, p)
    np.testing.assert_array_equal(store.opt.velocity, v)
    assert len(comm.sent) == 9 and stream.version == 1  # each chunk once to each worker


def test_a_push_rejected_after_its_chunk_was_applied_redoes_the_round(monkeypatch):
    store, comm = _store()
    before = store.params.copy()
    monkeypatch.setattr("ebsp_mpi.runtime.servers.round_stream.wait_all", lambda requests, backoff, on_idle=None: None)
    stream = _opened(store, version=5)
    _round(stream, store, [(w, j) for j in range(3) for w in range(3)], [(0, True), (1, False), (2, True)])
    assert stream.redo and len(comm.sent) == 9  # every chunk streamed with worker 1's gradient in it
    with pytest.raises(ProtocolError, match="members"):  # rank 0 and this server must agree
        stream.close((0, 1, 2), 5, lambda: None, None, None)
    closed = stream.close((0, 2), 5, lambda: None, None, None)
    assert closed.redo and stream.redone == 1 and stream.version == 6
    p, v = _one_step(before, store.grads, [0, 2])
    np.testing.assert_array_equal(store.params, p)
    np.testing.assert_array_equal(store.opt.velocity, v)
    # the second set: every chunk again to every worker, the corrected weights
    again = comm.sent[9:]
    assert sorted((rank, tag) for rank, tag, _ in again) == sorted((r, t) for r in (1, 2, 3) for t in (100, 101, 102))
    for _rank, tag, values in again:
        c = CHUNKS[tag - CHUNK_TAG0]
        np.testing.assert_array_equal(values, p[c.start:c.stop])


def test_a_rejection_known_before_any_chunk_streams_needs_no_redo():
    store, comm = _store()
    before = store.params.copy()
    stream = _opened(store, version=0)
    stream.header_in(1, False)  # worker 1's header first: its push is known rejected
    _round(stream, store, [(w, j) for j in range(3) for w in range(3)], [(0, True), (2, True)])
    closed = stream.close((0, 2), 0, lambda: None, None, None)
    assert not closed.redo and len(comm.sent) == 9
    np.testing.assert_array_equal(store.params, _one_step(before, store.grads, [0, 2])[0])


def test_a_worker_stopping_by_its_limit_gets_no_streamed_chunk():
    """Worker 2's push is its last: its stop reply comes at once (answered: nothing from the round) or
    with the round (every chunk at the close, of the weights after it)."""
    for answered in (True, False):
        store, comm = _store()
        stream = RoundStream(store, version=0)
        stream.expect(0, last=False)
        stream.expect(1, last=False)
        stream.expect(2, last=True)
        _round(stream, store, [(w, 0) for w in range(3)], [])
        assert sorted(rank for rank, _, _ in comm.sent) == [1, 2]  # workers 0 and 1, chunk 0
        if answered:
            stream.answer(2)
        _round(stream, store, [(w, j) for j in (1, 2) for w in range(3)], [(w, True) for w in range(3)])
        closed = stream.close((0, 1, 2), 0, lambda: None, None, None)
        to_2 = sorted(tag for rank, tag, _ in comm.sent if rank == 3)
        assert to_2 == ([] if answered else [100, 101, 102])
        assert sorted(closed.sends) == ([0, 1] if answered else [0, 1, 2])


def test_a_worker_cannot_join_a_round_whose_chunks_are_arriving():
    store, _ = _store()
    stream = RoundStream(store, version=0)
    stream.expect(0, last=False)
    stream.chunk_in(0)  # with one worker expected, chunk 0 would be complete: a second may not join now
    with pytest.raises(ProtocolError, match="joins a round"):
        stream.expect(1, last=False)


def test_without_streaming_every_chunk_waits_for_the_close():
    store, comm = _store()
    stream = RoundStream(store, version=0, early=False)
    for w in range(3):
        stream.expect(w, last=False)
    _round(stream, store, [(w, j) for j in range(3) for w in range(3)], [(w, True) for w in range(3)])
    assert comm.sent == [] and not stream.open
    stream.close((0, 1, 2), 0, lambda: None, None, None)
    assert len(comm.sent) == 9


@pytest.mark.timeout(300)
@pytest.mark.slow
@pytest.mark.mpi_impl
def test_a_round_redone_after_a_nan_push_equals_the_round_never_streamed(tmp_path):
    """Worker 1's poisoned pushes (NaN, one per epoch) go out chunk by chunk during its backward pass,
    their header only after its injected delay: the server streams the round's chunks with the NaN
    gradient in them, then redoes the round. The model equals that of the same run applying each
    round only once every push is whole."""
    data = write_poisoned(tmp_path / "data.h5")
    job = ["data.name=hdf5", f"data.path={data}", "data.normalize=false", "data.batch_size=10", "sync.model=bsp",
           "stop.iterations=20", "runtime.chunk_bytes=1024", "straggler.slowdown=[1, 10]", "straggler.base_s=0.01",
           "straggler.jitter_sigma=0", "optim.momentum=0.9"]
    runs = {}
    for stream in ("true", "false"):
        out = tmp_path / stream
        p = train(3, out, *job, f"runtime.stream_rounds={stream}")
        assert p.returncode == 0, p.stderr
        summary = json.loads((out / "summary.json").read_text())
        assert summary["rejected_pushes"] == 2
        runs[stream] = (read_model(out / "model.h5")[0], read_run(Path(out))[0].attrs["redone_rounds"])
    (streamed, redone), (whole, never) = runs["true"], runs["false"]
    assert redone >= 1 and never == 0
    assert sorted(streamed) == sorted(whole)
    for k in streamed:
        assert np.isfinite(streamed[k]).all()
        np.testing.assert_array_equal(streamed[k], whole[k])


@pytest.mark.parametrize("hosts, expected", [(["n1", "n1", "n1"], False), (["n1", "n1", "n2"], True),
                                              (["n1", "n2", "n2"], True), ([], False)])
def test_auto_streams_where_a_worker_is_on_another_node(hosts, expected):
    """runtime.stream_rounds = "auto": a network link between the server and a worker streams, shared
    memory does not (bench ps: streaming there cost 0.15 - 0.23 of raw MPI's rate); true and false are kept."""
    ctx = SimpleNamespace(hosts=hosts, rank=0, workers=2, worker_rank=lambda w: w + 1)
    assert streams("auto", ctx) is expected
    assert streams(True, ctx) is True and streams(False, ctx) is False
