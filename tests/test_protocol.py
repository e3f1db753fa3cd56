"""How a push or a reply is cut into messages, and what the server does with messages no receive was
posted for; without MPI running."""

import re

import numpy as np
import pytest
from mpi4py import MPI

from ebsp_mpi.nn import build_model
from ebsp_mpi.runtime.transport import protocol
from ebsp_mpi.runtime.transport.hybrid import parts_of_chunks
from ebsp_mpi.runtime.transport.layout import _coalesced
from ebsp_mpi.runtime.transport.protocol import (AUTO_CHUNK_BYTES, CHUNK_TAG0, PULL, PULL_FIELDS, PUSH, PUSH_FIELDS,
                                                 STATS_TAG, ProtocolError, chunk_bytes_for, coalesce_chunks,
                                                 field_index, header, pack, plan_chunks)
from ebsp_mpi.runtime.worker.wire_dense import _chunks_of_tensors


def test_headers_are_written_and_read_by_field_name():
    head = header(PUSH_FIELDS)
    pack(head, PUSH_FIELDS, epoch=1.5, loss=0.25, iteration=7, version=3, injected_delay_s=0.01, compute_s=0.5,
         wait_s=0.25, finite=1.0, flushed=0.0)
    assert (head[PUSH.iteration], head[PUSH.version], head[PUSH.loss], head[PUSH.finite]) == (7, 3, 0.25, 1.0)
    assert head[PUSH.flushed] == 0.0
    assert (head[PUSH.injected_delay_s], head[PUSH.epoch]) == (0.01, 1.5)
    reply = header(PULL_FIELDS)
    pack(reply, PULL_FIELDS, stop=1.0, flush=0.0, version=9, redo=1.0)
    assert (reply[PULL.version], reply[PULL.stop], reply[PULL.flush], reply[PULL.redo]) == (9, 1.0, 0.0, 1.0)


def test_a_missing_or_unknown_header_field_is_an_error():
    head = header(PULL_FIELDS)
    with pytest.raises(ValueError, match="expected exactly"):
        pack(head, PULL_FIELDS, version=1)
    with pytest.raises(ValueError, match="expected exactly"):
        pack(head, PULL_FIELDS, version=1, stop=0.0, flush=0.0, loss=2.0)


def test_field_positions_follow_the_fields_whatever_their_order():
    index = field_index(("b", "a", "c"))
    assert (index.a, index.b, index.c) == (1, 0, 2)


def test_every_tag_is_named_once_in_the_protocol():
    tags = {name: value for name, value in vars(protocol).items() if name.endswith("_TAG")}
    assert set(tags) == {"PUSH_TAG", "PULL_TAG", "CLOCK_TAG", "STATS_TAG", "ALIVE_TAG", "ORDER_TAG", "SNAP_TAG",
                         "FETCH_TAG", "SETUP_TAG"}
    assert len(set(tags.values())) == len(tags) and max(tags.values()) < CHUNK_TAG0


def test_chunks_cover_the_buffer_in_order_and_never_straddle_tensors():
    bounds = [(0, 10), (10, 3), (13, 25)]
    chunks = plan_chunks(bounds, itemsize=4, chunk_bytes=32)  # 8 elements per chunk
    assert [(c.start, c.stop) for c in chunks] == [(0, 8), (8, 10), (10, 13), (13, 21), (21, 29),
                                                    (29, 37), (37, 38)]
    assert [c.tag for c in chunks] == list(range(CHUNK_TAG0, CHUNK_TAG0 + len(chunks)))
    assert max(c.size for c in chunks) * 4 <= 32


def test_too_many_chunks_for_the_tag_limit_is_an_error():
    with pytest.raises(ValueError, match=re.escape("raise runtime.chunk_bytes")):
        plan_chunks([(0, 1000)], itemsize=4, chunk_bytes=4, tag_ub=CHUNK_TAG0 + 10)


def test_runs_of_small_whole_tensors_join_into_one_message():
    # tensors of 10, 5, 100, 3 and 4 elements in pieces of at most 40: the 100 in three, never joined
    chunks = plan_chunks([(0, 10), (10, 5), (15, 100), (115, 3), (118, 4)], itemsize=4, chunk_bytes=160)
    whole = [(c.start, c.stop) in {(0, 10), (10, 15), (115, 118), (118, 122)} for c in chunks]
    joined = coalesce_chunks(chunks, whole, limit=20)
    assert [(c.start, c.stop) for c in joined] == [(0, 15), (15, 55), (55, 95), (95, 115), (115, 122)]
    assert [c.tag for c in joined] == list(range(CHUNK_TAG0, CHUNK_TAG0 + 5))
    tighter = coalesce_chunks(chunks, whole, limit=12)  # 0-15 would hold 15 elements
    assert [(c.start, c.stop) for c in tighter][:2] == [(0, 10), (10, 15)] and len(tighter) == 6


def test_a_joined_message_charges_each_of_its_tensors_and_leaves_sfb_weights_alone():
    space = build_model("mlp", (20,), 5, hidden=[30], seed=0).space  # dense1.W, .b, dense2.W, .b
    chunks = plan_chunks([(t.offset, t.size) for t in space.tensors], 4, chunk_bytes=4096)
    joined = _coalesced(chunks, space, set(), 4096)
    assert len(joined) == 1 and parts_of_chunks(space, joined)[0] == tuple((t.name, t.size) for t in space.tensors)
    apart = _coalesced(chunks, space, {"dense1.W"}, 4096)  # its factors go their own way
    assert [parts_of_chunks(space, [c])[0][0][0] for c in apart] == ["dense1.W", "dense1.b"]
    assert _chunks_of_tensors(space, joined) == {t.name: [] for t in space.tensors}  # it goes with the rest


def test_each_tensor_knows_its_chunks_for_wait_free_backprop():
    space = build_model("mlp", (20,), 5, hidden=[30], seed=0).space
    chunks = plan_chunks([(t.offset, t.size) for t in space.tensors], 4, chunk_bytes=256)
    owned = _chunks_of_tensors(space, chunks)
    assert sorted(k for ks in owned.values() for k in ks) == list(range(len(chunks)))  # each once
    for t in space.tensors:
        assert sum(chunks[k].size for k in owned[t.name]) == t.size


def test_automatic_chunk_size_depends_on_whether_ranks_share_cores():
    assert chunk_bytes_for(65536, oversubscribed=True) == chunk_bytes_for(65536, oversubscribed=False) == 65536
    assert chunk_bytes_for(0, oversubscribed=False) == AUTO_CHUNK_BYTES["own core"] == 512 << 10
    assert chunk_bytes_for(0, oversubscribed=True) == AUTO_CHUNK_BYTES["shared cores"] == 4 << 20


class _Inbox:
    """A communicator holding unmatched messages ``(source rank, tag, object)``, for the server's
    handling of messages no receive was posted for."""

    def __init__(self, *messages):
        self.messages = list(messages)

    def Iprobe(self, source, tag, status):
        found = [m for m in self.messages if tag in (MPI.ANY_TAG, m[1])]
        if not found:
            return False
        status.Set_source(found[0][0])
        status.Set_tag(found[0][1])
        return True

    def recv(self, source, tag):
        found = [m for m in self.messages if m[:2] == (source, tag)]
        assert found, (source, tag)
        self.messages.remove(found[0])
        return found[0][2]


def _server_with(inbox, left, paced=()):
    from types import SimpleNamespace

    from ebsp_mpi.runtime.servers.peers import PeerServers

    ctx = SimpleNamespace(comm=inbox, servers=1, worker_of=lambda rank: rank - 1, now=lambda: 0.0)
    flushed = []  # the workers whose traces are closed, in the order their statistics came
    store = SimpleNamespace(paced=lambda source, tag: (source, tag) in paced)
    return SimpleNamespace(ctx=ctx, coordinator=SimpleNamespace(left=set(left)), stats=[None, None],
                           peers=PeerServers(ctx, None, 60.0), flushed=flushed, _flushed=flushed.append,
                           store=store)


def test_the_server_takes_the_statistics_of_stopped_workers():
    from ebsp_mpi.runtime.servers.server import Server

    server = _server_with(_Inbox((2, STATS_TAG, {"iterations": 7}), (1, STATS_TAG, {"iterations": 8})), {0, 1})
    assert Server._take_other_messages(server) is True
    assert server.stats == [{"iterations": 8}, {"iterations": 7}]
    assert server.flushed == [1, 0]  # a worker that reports has closed its trace: a pending checkpoint may commit
    assert Server._take_other_messages(server) is False


@pytest.mark.parametrize("tag, left, taken", [(STATS_TAG, set(), None),             # before the stop
                                              (999, {0}, None),                    # a tag nobody sends
                                              (STATS_TAG, {0}, {"iterations": 1})],  # twice
                         ids=["early", "stray", "twice"])
def test_the_server_rejects_any_other_unmatched_message(tag, left, taken):
    from ebsp_mpi.runtime.servers.server import Server

    server = _server_with(_Inbox((1, tag, {})), left)
    server.stats[0] = taken
    with pytest.raises(ProtocolError, match=f"unexpected message from rank 1 with tag {tag}"):
        Server._take_other_messages(server)


def test_a_chunk_whose_receive_is_posted_in_its_turn_is_no_error_nor_hides_statistics():
    """A streamed BSP round posts its chunks' receives in turn (``ShardStore.expect_push``): such a
    chunk waits unmatched, and a worker's statistics behind it are still taken."""
    from ebsp_mpi.runtime.servers.server import Server

    chunk = (2, CHUNK_TAG0 + 3)
    server = _server_with(_Inbox((*chunk, None), (1, STATS_TAG, {"iterations": 8})), {0}, {chunk})
    assert Server._take_other_messages(server) is True
    assert server.stats == [{"iterations": 8}, None]
    assert Server._take_other_messages(server) is False
    stray = _server_with(_Inbox((2, CHUNK_TAG0 + 3, None)), {0})  # the same chunk, not paced: an error
    with pytest.raises(ProtocolError, match=f"unexpected message from rank 2 with tag {CHUNK_TAG0 + 3}"):
        Server._take_other_messages(stray)


def test_replies_in_flight_are_told_apart_by_identity():
    """Two replies to one worker can be in flight at once; telling finished ones from the rest must not
    compare their buffers (a field-wise == raised "truth value of an array is ambiguous")."""
    from ebsp_mpi.runtime.servers.shard import PendingReply

    first = PendingReply(1, [], np.zeros(4, np.float32), np.zeros(2))
    second = PendingReply(1, [], np.ones(4, np.float32), np.zeros(2))
    assert first in [first] and second not in [first] and first != second


def test_a_wait_on_the_server_counts_its_keep_alives_as_word_from_it(monkeypatch):
    """A worker's deadline on the server (``deadlines.Silence``): silence past the timeout is a StallError naming
    the server, but each keep-alive that arrives starts the count again and posts the receive anew."""
    from ebsp_mpi.runtime.transport import deadlines
    from ebsp_mpi.runtime.transport.failures import StallError

    clock = [0.0]
    monkeypatch.setattr(deadlines.time, "monotonic", lambda: clock[0])

    class KeepAlive:
        def __init__(self):
            self.arrived, self.posted = False, 0

        def Test(self):
            arrived, self.arrived = self.arrived, False
            return arrived

        def Start(self):
            self.posted += 1

    keepalive = KeepAlive()
    silence = deadlines.Silence(4.0, "the server (rank 0)", keepalive)
    clock[0] = 3.9
    silence.check()  # within the timeout
    keepalive.arrived = True
    clock[0] = 7.0
    silence.check()  # 7 s without a reply, but a keep-alive came: fine, and the receive is posted again
    assert keepalive.posted == 1
    clock[0] = 10.9
    silence.check()
    clock[0] = 11.1
    with pytest.raises(StallError, match=r"the server \(rank 0\) sent nothing for 4\.1 s"):
        silence.check()


def test_a_wait_looks_at_its_deadline_at_most_every_few_milliseconds(monkeypatch):
    """Each look at the keep-alive is an MPI call; a waiting rank polls every 20 - 200 us."""
    from ebsp_mpi.runtime.transport import deadlines
    from ebsp_mpi.runtime.transport.failures import StallError

    clock = [0.0]
    monkeypatch.setattr(deadlines.time, "monotonic", lambda: clock[0])

    class KeepAlive:
        tests = 0

        def Test(self):
            self.tests += 1
            return False

    keepalive = KeepAlive()
    silence = deadlines.Silence(4.0, "the server (rank 0)", keepalive)
    for step in range(100):  # 100 polls 20 us apart: 2 ms
        clock[0] = step * 2e-5
        silence.check()
    assert keepalive.tests == 1
    clock[0] = 4.1  # still, past the timeout the next look raises
    with pytest.raises(StallError):
        silence.check()
