"""The receives of the workers' pushes into one server: every part of every worker's next push.

A server keeps, per worker, a gradient buffer and a header with a persistent receive posted for every
part of the worker's next push that comes to it (its gradient chunks, the factors of its SFB layers,
the header), and takes what has arrived with one ``Testsome``. A streamed BSP round
(``runtime.servers.round_stream``) is told of each chunk and header as it comes, and paces the receives of
the chunks (:meth:`PushReceives.expect_push`). The header completes a push; it says whether every
value the worker sent was finite, so every server rejects the same pushes. A worker on this server's
node whose gradient the server reads in place (``transport.push_window``) sends the header alone.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
from mpi4py import MPI

from ..transport.hybrid import PS, SFB
from ..transport.protocol import CHUNK_TAG0, PUSH, PUSH_FIELDS, PUSH_TAG, ProtocolError, header

#: PushReceives.part_kind of a push's parts that are no chunk: an SFB layer's factors, the header
SFB_PART, HEADER_PART = -1, -2


class Arrivals(NamedTuple):
    """What one poll of the push receives took in: how many parts (chunks, factor blocks, headers)
    arrived, and the workers whose push became complete, in the order they completed.

    A polling loop counts any part as progress, not only a complete push: the next part of a push
    is then seen at once instead of after the back-off's longest sleep, once per part (the cause of
    a 4.4x slower BSP, docs/performance.md)."""

    parts: int
    complete: list[int]


class PushReceives:
    """Every worker's next push into this server.

    Parameters
    ----------
    ctx : Context
    params : numpy.ndarray
        The whole flat parameter buffer: the gradient buffers are its size, indexed by flat offsets.
    pushed : list of Chunk
        The chunks of this server's shard that workers push (its SFB layers' come as factors).
    factors : Stacked or None
        The factor buffers of the SFB layers this server owns.
    stream : RoundStream or None
        BSP: the rounds told of each part as it comes.
    pace : int or None
        A streamed round: the chunks of each push posted ahead (None: all at once).
    send_order : list of int
        The indices of `pushed` in the order a worker sends them.
    """

    def __init__(self, ctx, params: np.ndarray, pushed, factors, stream, pace: int | None, send_order: list[int]):
        self.ctx, self.n, self.pushed = ctx, ctx.workers, pushed
        self.factors, self.stream, self.pace, self.send_order = factors, stream, pace, send_order
        self.posted = np.zeros(self.n, dtype=np.int64)  # per worker, its push's chunks with a receive posted
        self.turn = np.argsort(send_order)  # each pushed chunk's place in the send order
        # the workers whose gradient this server reads where it lies (``transport.push_window``): of
        # their pushes only the header comes as a message
        window = ctx.push_window
        self.window = window
        self.in_place = {ctx.worker_of(r): g for r, g in window.read_by(ctx.rank).items()} if window else {}
        if self.in_place and stream is not None and stream.early:
            raise ValueError("a streamed round cannot read pushes in place: it starts on each chunk's message")
        self.headers_in_place = 0  # headers of pushes read in place since the bytes were last counted
        self._make_receives(ctx, params, pushed)

    def _make_receives(self, ctx, params: np.ndarray, pushed) -> None:
        """One gradient buffer and header per worker, with persistent receives for every part of a push
        that comes to this server: its gradient chunks, the factors of its SFB layers, the header. A
        push read in place has its header's receive alone, and the worker's own gradient as buffer."""
        n = self.n
        self.grads = [self.in_place[w] if w in self.in_place else np.empty_like(params) for w in range(n)]
        self.headers = [header(PUSH_FIELDS) for _ in range(n)]
        self.recvs: list[MPI.Prequest] = []
        # request index -> (worker, expected count, MPI datatype, gradient chunk or factor block, the chunk's
        # index (PS) or the layer (SFB), scheme)
        self.part_of: list[tuple] = []
        self.first = np.zeros(n, dtype=np.int64)  # per worker, the index of its first request
        self.parts_of = np.zeros(n, dtype=np.int64)  # ... and how many parts its push has here
        for w in range(n):
            self.first[w] = len(self.recvs)
            for c in pushed if w not in self.in_place else ():
                piece = self.grads[w][c.start:c.stop]
                self.recvs.append(ctx.comm.Recv_init([piece, MPI.FLOAT], ctx.worker_rank(w), c.tag))
                self.part_of.append((w, c.size, MPI.FLOAT, piece, c.tag - CHUNK_TAG0, PS))
            if self.factors is not None:
                for req, name, piece in self.factors.receives(ctx.factor_comm, ctx.worker_rank, [w]):
                    self.recvs.append(req)
                    self.part_of.append((w, piece.size, MPI.FLOAT, piece, name, SFB))
            self.recvs.append(ctx.comm.Recv_init([self.headers[w], MPI.DOUBLE], ctx.worker_rank(w), PUSH_TAG))
            self.part_of.append((w, len(PUSH_FIELDS), MPI.DOUBLE, None, None, None))
            self.parts_of[w] = len(self.recvs) - self.first[w]
        # per request, for a streamed round: the pushed chunk's index, SFB_PART or HEADER_PART
        self.chunk_of_tag = {c.tag: j for j, c in enumerate(pushed)}
        self.part_kind = [self.chunk_of_tag[CHUNK_TAG0 + what] if scheme == PS
                          else SFB_PART if scheme == SFB else HEADER_PART
                          for _, _, _, _, what, scheme in self.part_of]
        self.arrivals_of_part = [0] * len(self.part_of)
        self.statuses = [MPI.Status() for _ in self.recvs]
        self.missing = np.zeros(n, dtype=np.int64)  # parts of the current push not yet arrived

    # -- pushes ---------------------------------------------------------------------------------

    def expect_push(self, w: int) -> None:
        """Post the receives of `w`'s next push (before `w` can send it: with its pull reply).

        A streamed BSP round posts the chunks' receives :data:`PACE_BYTES` ahead, in the order the
        workers send them, one more for every worker each time a chunk is in from all of them. A large
        message moves only once its receive is posted (MPI's rendezvous), so the workers' pushes share
        the server's link chunk by chunk: without it one worker's push came in whole while another's
        first chunk waited, and the round's first chunk, with it the replies, started late."""
        first, parts = self.first[w], self.parts_of[w]
        self.missing[w] = parts
        if w in self.in_place:  # its previous push, read in place, is done with before the reply goes
            self.window.sync()
        if self.pace is None:
            MPI.Prequest.Startall(self.recvs[first:first + parts])
            return
        chunks = len(self.pushed)
        ahead = [first + j for j in self.send_order[:self.pace]]
        MPI.Prequest.Startall([self.recvs[i] for i in ahead] + self.recvs[first + chunks:first + parts])
        self.posted[w] = len(ahead)

    def paced(self, source: int, tag: int) -> bool:
        """A message from rank `source` with `tag` is a chunk of a push whose receive is posted in its
        turn (:meth:`expect_push`), not yet."""
        if self.pace is None or source < self.ctx.servers:
            return False
        w, j = self.ctx.worker_of(source), self.chunk_of_tag.get(tag)
        return j is not None and bool(self.stream.expected[w]) and self.turn[j] >= self.posted[w]

    def _post_next_chunk(self) -> None:
        """A chunk is in from every worker of the round: post the next chunk's receive for each."""
        order = self.send_order
        for w in np.flatnonzero(self.stream.expected):
            if self.posted[w] < len(order):
                self.recvs[self.first[w] + order[self.posted[w]]].Start()
                self.posted[w] += 1

    def take_parts(self, last_heard: np.ndarray | None = None, now: float = 0.0) -> Arrivals:
        """Take the parts of pushes that have arrived (:class:`Arrivals`). With `last_heard` (the
        watchdog's, on rank 0), ``last_heard[w]`` becomes `now` for every worker a part came from."""
        done = MPI.Request.Testsome(self.recvs, self.statuses)
        complete = []
        for k, i in enumerate(done or ()):  # statuses[k] belongs to done[k], as in MPI_Testsome
            w, expected, datatype, piece = self.part_of[i][:4]
            count = self.statuses[k].Get_count(datatype)
            if count != expected:
                raise ProtocolError(f"push from rank {self.ctx.worker_rank(w)}: message with tag "
                                    f"{self.statuses[k].Get_tag()} has {count} values, expected {expected}")
            if piece is not None:
                self.arrivals_of_part[i] += 1
            if self.stream is not None:
                self._streamed_part(w, i)
            if last_heard is not None:
                last_heard[w] = now
            self.missing[w] -= 1
            if self.missing[w] == 0:
                if w in self.in_place:  # its header has come: its gradient is there to read
                    self.window.sync()
                    self.headers_in_place += 1
                complete.append(w)
                if self.stream is not None:
                    self.stream.push_in(w)
        return Arrivals(len(done or ()), complete)

    def _streamed_part(self, w: int, i: int) -> None:
        kind = self.part_kind[i]
        if kind >= 0:
            if self.stream.chunk_in(kind) and self.pace is not None:
                self._post_next_chunk()
        elif kind == HEADER_PART:
            self.stream.header_in(w, bool(self.headers[w][PUSH.finite]))

    def rejected(self, w: int, iteration: int) -> bool:
        """Whether `w`'s complete push (its `iteration`-th) is rejected: its header says some value was
        NaN or Inf. Every server reads the same header, so all reject the same pushes. The worker
        checked every value before it sent it (``wire_dense.FiniteCheck``), once: MPI delivers those
        bytes, so a second check here would only lengthen the server's round."""
        head = self.headers[w]
        if int(head[PUSH.iteration]) != iteration:
            raise ProtocolError(f"push from rank {self.ctx.worker_rank(w)}: iteration {int(head[PUSH.iteration])}, "
                                f"expected {iteration}")
        return not head[PUSH.finite]

    def settle_counts(self, counter, layout, itemsize: int) -> None:
        """Add the bytes of the parts received since the last call to `counter` (a ``ByteCounter``); a
        push read in place counts the bytes of its chunks as pushed, as its messages would have."""
        for c in self.pushed if self.headers_in_place else ():
            for tensor, elements in layout.parts(c.tag - CHUNK_TAG0):
                counter.received(tensor, PS, self.headers_in_place * elements * itemsize)
        self.headers_in_place = 0
        for i, n in enumerate(self.arrivals_of_part):
            _, _, _, piece, what, scheme = self.part_of[i]  # what: a chunk's index (PS), a layer's name (SFB)
            if n and piece is not None:
                if scheme == PS:
                    for tensor, elements in layout.parts(what):
                        counter.received(tensor, PS, n * elements * itemsize)
                else:
                    counter.received(what, scheme, n * piece.nbytes)
        self.arrivals_of_part = [0] * len(self.part_of)
