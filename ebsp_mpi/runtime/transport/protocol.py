"""The wire protocol between the parameter servers (ranks 0..k-1) and the workers (ranks k..N-1).

One place names every tag and lays out every message; both sides build their buffers from here.
Nothing in this module calls MPI, so the layout is tested without it.

A worker's iteration, as messages (docs/design.md, "Parameters on the wire"):

- **push** (worker -> servers): the gradient, one message per chunk of the ``ParamSpace`` gradient
  buffer (tag ``CHUNK_TAG0 + k``) to the server that owns the chunk, then a header (``PUSH_TAG``) of
  :data:`PUSH_FIELDS` to every server. The header completes the push; a server acts on a push only
  when its chunks and the header have arrived. The header says whether the whole gradient was finite,
  so that every server rejects the same pushes (all or nothing).
- **pull reply** (servers -> worker): a header (``PULL_TAG``) of :data:`PULL_FIELDS` from rank 0, and
  the weights, chunked like the gradient, each chunk from its owner. A worker's next push implies its
  next pull request, so there is no separate request message.
- **orders** (rank 0 -> servers 1..k-1, ``ORDER_TAG``): with ``runtime.servers = k > 1`` rank 0 alone
  runs the sync policy, and tells the other servers, in one ordered stream, what to do with their
  shards: apply or reject a push, apply a round, answer a pull, send a snapshot (the order records of
  ``runtime.servers.orders``, which rank 0 carries out too). Each server carries the orders out in their
  order, so every shard applies the same pushes in the same order as rank 0's, and a pulled or
  evaluated model is exactly the one rank 0 decided on. A snapshot goes back to rank 0 on
  ``SNAP_TAG``; servers and rank 0 exchange keep-alives (``ALIVE_TAG``) while idle.
- **keep-alive** (rank 0 -> worker, ``ALIVE_TAG``): while the sync model holds a worker's pull, and
  from its stop reply to the end of the run, the server tells it every quarter of
  ``runtime.stall_timeout_s`` that it still lives, so that a worker's own watchdog (no word from the
  server within the stall timeout) tells a long hold, or a wait for slower workers to finish, from a
  dead or stopped server. Once every worker's statistics are in, the last one it sends each worker
  says so (``keepalive.PARTING``): the worker keeps one receive of them posted from start-up until that one
  has come, so none is left unmatched.
- **fetch** (worker <-> server, on the fetch communicator, ``FETCH_TAG``): with an OSDP plan
  (``osdp.plan``) a worker holds its on-demand layers' weights only while it computes with them. It
  asks for one unit (a layer, or a slice of one) with a one-value request (the unit's index in the
  schedule, ``plan.osdp_schedule``) to each server that holds part of it, and each answers with its
  part of the unit's weights as they are now: under BSP the round's, under the other models the
  latest. The unit's gradient goes back as
  ordinary push chunks (the messages break at the unit's edges), and no pull reply carries the unit.
- **set-up outcome** (``SETUP_TAG``, to rank 0), once per rank before training: its exit code (0:
  set up); rank 0 broadcasts them all (``runtime.launch``), naming a rank that has not sent its code
  within ``runtime.setup_timeout_s``.
- **statistics** (``STATS_TAG``, to rank 0), once per rank: from a worker after the reply that told
  it to stop, and from each of servers 1..k-1 after rank 0's ``end`` order; a small dict for the
  run's summary (the only pickled message; it is off the hot path). Rank 0 takes each whenever it
  arrives and waits for the missing ones at the end, polling, so that a rank that dies after its
  last message still ends the job instead of hanging it.

Chunks follow the tensors (last layer's tensors last), and a tensor larger than ``chunk_bytes`` is split,
so a layer's gradient can go out as soon as its backward is done (Poseidon's wait-free backpropagation);
small whole tensors side by side may share one chunk (:func:`coalesce_chunks`), which goes at the end.
Headers are float64 arrays: every integer field is exact below 2**53.
"""

from __future__ import annotations

from collections import namedtuple
from dataclasses import dataclass

import numpy as np

from .env import SHM_EAGER_BYTES

PUSH_TAG = 1
PULL_TAG = 2
CLOCK_TAG = 3  # the clock-offset ping-pong at start-up (transport.clock)
STATS_TAG = 4
ALIVE_TAG = 5  # the server to a worker whose pull it holds, or that has stopped: it still lives (comm.ALIVE),
#               or, once every worker has reported, that none will follow (keepalive.PARTING)
ORDER_TAG = 6  # rank 0 to the other servers: the orders of the sync policy (runtime.servers > 1)
SNAP_TAG = 7  # a server to rank 0: its shard of the parameters (and optimizer state), as ordered
FETCH_TAG = 8  # a worker's request for an on-demand unit, and a server's reply (on Context.fetch_comm)
SETUP_TAG = 9  # each rank to rank 0: the outcome of its set-up (runtime.launch)
CHUNK_TAG0 = 100

#: push header: iteration (0-based index of this worker's iteration), the model version the gradient was
#: computed from, the minibatch loss, the injected straggler delay (s), epochs of its shard done, the
#: seconds of forward + backward, and the seconds the worker waited for the weights it used (the server
#: sums these three per worker, so that a checkpoint knows them), 1 when every value the push
#: carries (gradient chunks, sufficient factors) is finite: the worker checks each value before sending it,
#: and every server rejects the push whole when the header says no; and 1 when the worker has flushed
#: its trace as the reply before asked (the server commits its pending checkpoint once every worker has)
PUSH_FIELDS = ("iteration", "version", "loss", "injected_delay_s", "epoch", "compute_s", "wait_s", "finite",
               "flushed")
#: pull reply header: the model version of the weights that follow, 1 when the worker must stop, 1 when
#: the worker should flush its trace (the server has written a checkpoint, which it commits once every
#: worker's trace holds what the checkpoint counts: what a resumed run keeps of the traces is what was
#: flushed before it), and 1 when a BSP round was redone: the weights came twice, the second time
#: corrected, and the worker takes them again (``runtime.servers.round_stream``)
PULL_FIELDS = ("version", "stop", "flush", "redo")


def field_index(fields: tuple[str, ...]):
    """Each field's position in a header of `fields`, by name (``PUSH.loss``), so that no code
    depends on the order of the fields."""
    return namedtuple("FieldIndex", fields)(*range(len(fields)))


#: positions in a push header and a pull reply header: ``head[PUSH.iteration]``, ``head[PULL.stop]``
PUSH = field_index(PUSH_FIELDS)
PULL = field_index(PULL_FIELDS)


def header(fields: tuple[str, ...]) -> np.ndarray:
    """A zeroed header buffer for `fields`."""
    return np.zeros(len(fields), dtype=np.float64)


def pack(head: np.ndarray, fields: tuple[str, ...], **values: float) -> None:
    """Write every field of `fields` into the header buffer `head`, by name; a missing or unknown
    field is an error (ValueError), not a silently shifted or stale value."""
    if len(values) != len(fields) or not all(name in values for name in fields):
        raise ValueError(f"header fields {sorted(values)}, expected exactly {list(fields)}")
    head[:] = [values[name] for name in fields]


@dataclass(frozen=True)
class Chunk:
    """A contiguous piece of the flat parameter (or gradient) buffer: elements [start, stop)."""

    start: int
    stop: int
    tag: int

    @property
    def size(self) -> int:
        return self.stop - self.start


#: ``runtime.chunk_bytes = 0``: where every rank has a core, small chunks let the server stream a BSP
#: reply (the worker copies chunk k while the server updates chunk k+1); where ranks share cores nothing
#: runs alongside, and every extra message costs a wake-up of a sleeping rank, so fewer, larger ones
AUTO_CHUNK_BYTES = {"own core": 512 << 10, "shared cores": 4 << 20}


def chunk_bytes_for(configured: int, oversubscribed: bool, total_bytes: int = 0, servers: int = 1) -> int:
    """The message size a run uses: ``runtime.chunk_bytes``, or when it is 0 the automatic choice for
    a job where some node is `oversubscribed` (the same on every rank, so both ends agree).

    With several servers the automatic size is also at most an eighth of a server's share of the
    model's `total_bytes`, so that the shards, made of whole chunks, can be balanced to within about
    an eighth even for a model of one big tensor."""
    if configured:
        return configured
    auto = AUTO_CHUNK_BYTES["shared cores" if oversubscribed else "own core"]
    if servers > 1 and total_bytes:
        auto = min(auto, max(4096, total_bytes // (8 * servers) // 4 * 4))
    return auto


def plan_chunks(tensor_bounds: list[tuple[int, int]], itemsize: int, chunk_bytes: int,
                tag_ub: int = 32767) -> list[Chunk]:
    """Split the flat buffer into messages: one per tensor, big tensors in pieces of <= chunk_bytes.

    Parameters
    ----------
    tensor_bounds : list of (offset, size)
        The tensors of the ``ParamSpace``, in buffer order, in elements.
    itemsize : int
        Bytes per element (4 for float32).
    chunk_bytes : int
        Largest message in bytes (``runtime.chunk_bytes``).
    tag_ub : int
        The MPI implementation's largest tag (``MPI.TAG_UB``; the standard guarantees 32767).
    """
    per_chunk = max(1, chunk_bytes // itemsize)
    chunks: list[Chunk] = []
    for offset, size in tensor_bounds:
        for start in range(offset, offset + size, per_chunk):
            chunks.append(Chunk(start, min(start + per_chunk, offset + size), CHUNK_TAG0 + len(chunks)))
    if chunks and chunks[-1].tag > tag_ub:
        raise ValueError(f"{len(chunks)} messages per push exceed the MPI tag limit {tag_ub}; "
                         f"raise runtime.chunk_bytes (now {chunk_bytes})")
    return chunks


#: consecutive whole tensors that together hold at most this many bytes go as one message (with one
#: server and no OSDP plan): a small model's push is bound by the count of its messages, each of which
#: costs both ends a completion and the server a pass of its loop (docs/performance.md: one message
#: instead of one per tensor ran the digits MLP 1.19 - 1.30 times as fast, in alternating pairs); the
#: limit of an eager message (``env.SHM_EAGER_BYTES``), so that a joined message travels as one copy
COALESCE_BYTES = SHM_EAGER_BYTES


def coalesce_chunks(chunks: list[Chunk], mergeable: list[bool], limit: int) -> list[Chunk]:
    """`chunks` with each run of consecutive `mergeable` chunks joined into one while the joined chunk
    holds at most `limit` elements; the tags numbered again in buffer order. A joined chunk goes at the
    end of the backward pass (it is no one tensor's to send early), which costs a small tensor nothing."""
    spans: list[list] = []  # [start, stop, mergeable]
    for c, ok in zip(chunks, mergeable, strict=True):
        last = spans[-1] if spans else None
        if ok and last is not None and last[2] and c.start == last[1] and c.stop - last[0] <= limit:
            last[1] = c.stop
        else:
            spans.append([c.start, c.stop, ok])
    return [Chunk(a, b, CHUNK_TAG0 + k) for k, (a, b, _) in enumerate(spans)]


@dataclass(frozen=True)
class Shard:
    """A server's part of the parameters: chunks [first, stop) of the flat buffer, elements [lo, hi)."""

    server: int
    first: int
    stop: int
    lo: int
    hi: int

    @property
    def size(self) -> int:
        return self.hi - self.lo


def plan_shards(chunks: list[Chunk], servers: int, together: list[list[int]] = ()) -> list[Shard]:
    """Deal the chunks to `servers` servers in contiguous shards of whole chunks whose largest holds as
    few bytes as possible (so no server carries much more traffic than the others).

    Parameters
    ----------
    chunks : list of Chunk
        The messages of a push, in buffer order (:func:`plan_chunks`).
    servers : int
        Number of server ranks.
    together : list of list of int
        Runs of consecutive chunk indices that must go to one server (an SFB layer's weight tensor:
        its factors rebuild the whole tensor on one rank).

    The exact min-max cut: a binary search on the largest shard, each candidate tested by filling
    shards greedily, which is optimal for a fixed bound on contiguous pieces.
    """
    if servers < 1:
        raise ValueError(f"servers must be >= 1, got {servers}")
    units = _units(len(chunks), together)
    if len(units) < servers:
        raise ValueError(f"{len(units)} messages per push cannot be dealt to {servers} servers; lower "
                         f"runtime.servers or runtime.chunk_bytes")
    sizes = [sum(chunks[k].size for k in unit) for unit in units]

    def cuts(bound: int) -> list[int] | None:
        """Start unit of each shard when every shard holds at most `bound` elements (None: impossible)."""
        starts, held = [0], 0
        for u, size in enumerate(sizes):
            must_cut = len(units) - u == servers - len(starts)  # as many units left as servers without one
            if (held + size > bound or must_cut) and u > starts[-1]:
                starts.append(u)
                held = 0
            held += size
            if held > bound or len(starts) > servers:
                return None
        return starts if len(starts) == servers else None

    lo, hi = max(sizes), sum(sizes)
    while lo < hi:
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if cuts(mid) is not None else (mid + 1, hi)
    starts = cuts(lo)
    shards = []
    for s, u0 in enumerate(starts):
        u1 = starts[s + 1] if s + 1 < len(starts) else len(units)
        first, stop = units[u0][0], units[u1 - 1][-1] + 1
        shards.append(Shard(s, first, stop, chunks[first].start, chunks[stop - 1].stop))
    return shards


def _units(n_chunks: int, together) -> list[list[int]]:
    """The chunk indices grouped into what must not be split between servers."""
    group_of = {}
    for g, run in enumerate(together):
        for k in run:
            group_of[k] = g
    units: list[list[int]] = []
    for k in range(n_chunks):
        if k in group_of and units and group_of.get(units[-1][-1]) == group_of[k]:
            units[-1].append(k)
        else:
            units.append([k])
    return units


def owner_of_chunks(shards: list[Shard]) -> list[int]:
    """The server of each chunk, by chunk index."""
    return [s.server for s in shards for _ in range(s.first, s.stop)]


class ProtocolError(RuntimeError):
    """A message of unexpected size, tag or content (the run stops rather than hangs)."""
