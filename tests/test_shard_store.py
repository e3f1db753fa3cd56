"""The pull-reply snapshots of ``runtime.servers.shard.ShardStore``, without a job of several ranks.

MPI forbids writing a buffer while a send of it is in flight, and a snapshot on the free list is one
the store will write again. The store here sends through a fake communicator whose sends are MPI
generalized requests (``MPI.Grequest``): real requests, so the store's ``Testall`` works on them,
that complete only when the test says so. Each send keeps a copy of what it was given, and is checked
against it when it completes: a buffer changed under a send in flight fails the test there. Every
reply here is a stop reply: it posts no receives for a next push, which these tests do not take.
"""

from __future__ import annotations

import numpy as np
import pytest

MPI = pytest.importorskip("mpi4py.MPI")


class Send:
    """One send the store posted: its request, and the data it was given."""

    def __init__(self, view: np.ndarray, dest: int, tag: int):
        self.view, self.sent, self.dest, self.tag = view, view.copy(), dest, tag
        self.request = MPI.Grequest.Start()
        self.done = False

    def complete(self) -> None:
        changed = f"the buffer of a send to rank {self.dest} (tag {self.tag}) changed while it was in flight"
        assert np.array_equal(self.view, self.sent), changed
        self.request.Complete()
        self.done = True


class FakeComm:
    """Just what ``make_layout`` and ``ShardStore`` ask of a communicator."""

    def __init__(self):
        self.sends: list[Send] = []

    def Get_attr(self, key):
        return MPI.COMM_SELF.Get_attr(key)

    def Recv_init(self, spec, source, tag):
        return None  # never started: every reply here is a stop reply, which posts no push receives

    def Isend(self, spec, dest, tag):
        send = Send(spec[0], dest, tag)
        self.sends.append(send)
        return send.request

    def in_flight(self) -> list[Send]:
        return [s for s in self.sends if not s.done]

    def complete(self, worker_rank: int | None = None) -> None:
        """Complete the sends in flight (only those to `worker_rank`, if given)."""
        for s in self.in_flight():
            if worker_rank is None or s.dest == worker_rank:
                s.complete()


@pytest.fixture
def store():
    """Rank 0's store of a run of one server and two workers under ASP (replies from snapshots), with
    messages of 1 KiB so that a reply is many sends."""
    from ebsp_mpi.config import load_job
    from ebsp_mpi.run_description import describe
    from ebsp_mpi.runtime.transport.context import Context
    from ebsp_mpi.runtime.transport.layout import make_layout
    from ebsp_mpi.runtime.servers.shard import ShardStore

    job = load_job(None, ["sync.model=asp", "trace.enabled=false", "runtime.chunk_bytes=1024"])
    ctx = Context(comm=FakeComm(), rank=0, size=3, local_rank=0)
    description = describe(job, ctx.workers, None)
    store = ShardStore(ctx, job, description.model().space.data, make_layout(ctx, description), 0, round_based=False)
    rng = np.random.default_rng(0)
    for g in store.grads:  # a push's gradient, as if it had arrived
        g[:] = rng.standard_normal(g.size, dtype=np.float32)
    yield store
    for s in ctx.comm.in_flight():  # leave no request of ours pending at MPI_Finalize, unchecked
        s.request.Complete()


def worker_rank(store, w: int) -> int:
    return store.ctx.worker_rank(w)


def assert_free_list_sound(store) -> None:
    """Every snapshot on the free list is there once, and none is still sent or still current."""
    free = [id(s) for s in store.free_snapshots]
    assert len(free) == len(set(free)), "a snapshot is on the free list twice"
    sending = {id(r.snapshot) for r in store.replies}
    assert not sending & set(free), "a snapshot on the free list is still being sent"
    assert id(store.current) not in free, "the current snapshot is on the free list"


def test_one_snapshot_serves_every_reply_until_the_shard_changes(store):
    a = store.reply_buffer()
    store.reply(0, a, stop=True)
    assert store.reply_buffer() is a  # no push applied since: no second copy
    store.apply(0, version=0)
    b = store.reply_buffer()
    assert b is not a  # a's replies are still sending
    lo, hi = store.lo, store.hi
    np.testing.assert_array_equal(b[lo:hi], store.params[lo:hi])


def test_a_snapshot_whose_replies_have_gone_is_not_handed_out_under_a_later_one(store):
    """A reply that follows no apply (to a rejected push, or ordered by rank 0) goes out from the
    current snapshot after that snapshot's earlier replies have completed; the caller may keep the
    buffer ``reply_buffer`` gave until it applies a push. The next snapshot must not be that buffer
    while the later reply is still sending from it."""
    comm = store.ctx.comm
    a = store.reply_buffer()
    store.reply(0, a, stop=True)
    comm.complete(worker_rank(store, 0))
    assert store.complete_replies()
    store.reply(1, a, stop=True)  # no push applied since a was taken: still the current snapshot
    store.apply(0, version=0)
    b = store.reply_buffer()
    assert b is not a
    store.reply(0, b, stop=True)
    comm.complete(worker_rank(store, 1))  # fails here if a was overwritten under worker 1's reply
    comm.complete(worker_rank(store, 0))
    assert store.complete_replies()
    assert_free_list_sound(store)


def test_a_snapshot_is_freed_once(store):
    comm = store.ctx.comm
    a = store.reply_buffer()
    for w in (0, 1):  # the second reply after the first has gone, from the same snapshot
        store.reply(w, a, stop=True)
        comm.complete(worker_rank(store, w))
        assert store.complete_replies()
        assert_free_list_sound(store)
    store.apply(0, version=0)
    assert [id(s) for s in store.free_snapshots] == [id(a)]  # not current, not sending: freed, once
    assert store.reply_buffer() is a  # and used again, with the new weights


def test_random_interleavings_never_write_a_buffer_under_a_send(store):
    """Replies, applies and completions in random order, each step followed by the server loop's
    ``complete_replies``; each send checks its buffer when it completes, and the free list is checked
    after every step. A reply goes out from ``reply_buffer()``, or from the buffer it last gave if no
    push was applied since."""
    comm, rng = store.ctx.comm, np.random.default_rng(1)
    version, kept, snapshots = 0, None, {}
    for _ in range(1000):
        step = rng.integers(4)
        if step == 0:  # a pull answered (a worker may have two replies in flight, as in a run)
            kept = store.reply_buffer()
            snapshots[id(kept)] = kept
            store.reply(int(rng.integers(store.n)), kept, stop=True)
        elif step == 1 and kept is not None:
            store.reply(int(rng.integers(store.n)), kept, stop=True)
        elif step == 2:
            store.apply(int(rng.integers(store.n)), version)
            version, kept = version + 1, None
        else:  # a worker takes what has been sent to it (each send checks its buffer as it completes)
            comm.complete(worker_rank(store, int(rng.integers(store.n))))
        store.complete_replies()
        assert_free_list_sound(store)
    assert version > 100 and len(snapshots) < version / 4  # the walk did apply, and reuse snapshots


def test_a_reply_part_way_sent_counts_as_progress(store):
    """The server loop polls again at once while a reply's sends complete one by one (MPICH moves a
    large message only while both ends poll); it sleeps only when nothing completed."""
    comm = store.ctx.comm
    store.reply(0, store.reply_buffer(), stop=True)
    sends = comm.in_flight()
    assert len(sends) > 2  # 1 KiB messages: the reply is many sends
    assert not store.complete_replies()  # nothing completed: the loop may sleep
    sends[0].complete()
    assert store.complete_replies()  # one chunk went: progress, though the reply is still sending
    assert len(store.replies) == 1
    assert not store.complete_replies()  # and nothing new since
    for s in sends[1:]:
        s.complete()
    assert store.complete_replies() and not store.replies
