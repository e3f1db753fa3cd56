"""OSDP's on-demand fetches, both ends: a worker's :class:`Fetcher` (the transport of
``nn.ondemand``) and every server's :class:`FetchServer`.

A worker holds an on-demand unit (a layer, or a slice of one) only while an item computes with it,
in one preallocated fetch buffer (``plan.osdp_schedule``). Every message runs on a persistent request
made once, on a fixed place of that buffer: the fetch of item i (to each server that holds part of
the unit, a request naming the unit and the worker's model version, and the receive of its part of
the weights) and the push of its gradient (one send per chunk of the unit, to the chunk's owner, with
the chunk's tag: the server takes them as part of the push, like any chunk). With one server a fetch is two messages;
with k, two per server the unit spans (``Layout.unit_pieces``). On a GPU without CUDA-aware MPI the
requests run on a host mirror of the buffer, copied to and from the device around them.

A fetch names the unit and the model version the worker holds (its last pull's). Under BSP a server
answers it once this server has closed every round up to that version, and at once otherwise: the
weights are then those of the version the worker computes at (no round ends before this worker's
push). That the worker has its pull reply is not enough: a server whose shard holds no resident
chunk sends no part of it, one whose resident chunks all went while the round streamed
(``runtime.servers.round_stream``) may have sent the last before its on-demand chunks are applied, and a
shard server closes a round only once rank 0's order is in, which goes out with the replies. A fetch
answered then read the weights before the round (0.03 off the oracle with every layer on demand on
two servers). Other sync models read each server's latest (with k servers, each shard's latest: a
unit spanning two shards may hold one push more on one of them, as any asynchronous read may). A
server's part is first copied into a reply buffer of the worker's, since a push may be applied while
the reply is sending.
"""

from __future__ import annotations

import time

import numpy as np
from mpi4py import MPI

from ...nn.ondemand import Transport
from ...plan.osdp_schedule import merge_runs
from .hybrid import PS
from .protocol import FETCH_TAG, ProtocolError

#: the byte counters' scheme of fetched weights (their gradients go back as ordinary push chunks, PS)
FETCH = "fetch"


def _unit_names(layout) -> list[str]:
    """The tensor each unit's bytes are counted under: that of its first chunk."""
    return [layout.chunk_tensor[chunks[0][0]] for chunks in layout.unit_chunks]


class Fetcher(Transport):
    """A worker's fetch buffer and the requests that fill and empty it.

    Parameters
    ----------
    ctx : Context
    layout : Layout
        With a schedule (``layout.schedule``).
    backend : Backend
        Where the buffer lives (the device on CuPy).
    staged : bool
        MPI runs on a host mirror (a GPU without CUDA-aware MPI).
    check : callable
        ``check(gradient)``: told every gradient the worker pushes (the NaN/Inf check of the push header).
    bytes : ByteCounter
    """

    def __init__(self, ctx, layout, backend, staged: bool, check, bytes):
        sched = layout.schedule
        self.sched, self.backend, self.staged, self.check, self.bytes = sched, backend, staged, check, bytes
        self.buffer = backend.xp.empty(sched.buffer_elems, dtype=np.float32)
        self.host = backend.host_empty(sched.buffer_elems) if staged else self.buffer
        self.names = _unit_names(layout)
        self.wait = None  # set by the worker: wait(requests, ranks), with its watchdog naming the silent ranks
        self.version = 0  # the model version the worker holds (set at each pull): every fetch names it
        self.waited_s, self.messages = 0.0, 0  # seconds waiting on fetches and pushes; their messages
        self.asks: dict[int, list] = {}
        self.pushes: dict[int, list] = {}
        self.ranks: dict[tuple[str, int], list[int]] = {}  # the rank each request of a fetch or push is with
        self._asked: dict[int, np.ndarray] = {}  # per item, its request (unit, version), kept alive while sent
        for i, item in enumerate(sched.items):
            if item.unit is None:
                continue
            unit = sched.units[item.unit]
            place = self.host[item.at:item.at + unit.elems]
            if item.fetched:
                ask = np.array([float(item.unit), 0.0])
                self._asked[i] = ask
                pieces = layout.unit_pieces(item.unit)
                ends = [offset for _, offset, _ in pieces[1:]] + [unit.elems]
                # the receives are posted before the requests go: a reply always finds its receive
                self.asks[i] = [ctx.fetch_comm.Recv_init([place[offset:end], MPI.FLOAT], server, FETCH_TAG)
                                for (server, offset, _), end in zip(pieces, ends, strict=True)]
                self.asks[i] += [ctx.fetch_comm.Send_init([ask, MPI.DOUBLE], server, FETCH_TAG)
                                 for server, _, _ in pieces]
                self.ranks["fetch", i] = [server for server, _, _ in pieces] * 2
            if item.kind == "backward":
                self.pushes[i] = [ctx.comm.Send_init([place[off:off + layout.chunks[k].size], MPI.FLOAT],
                                                     layout.owner[k], layout.chunks[k].tag)
                                  for k, off in layout.unit_chunks[item.unit]]
                self.ranks["push", i] = [layout.owner[k] for k, _ in layout.unit_chunks[item.unit]]

    def _place(self, i: int) -> tuple[int, int]:
        item = self.sched.items[i]
        return item.at, item.at + self.sched.units[item.unit].elems

    def fetch(self, i: int) -> None:
        self._asked[i][1] = self.version
        MPI.Prequest.Startall(self.asks[i])

    def arrived(self, i: int) -> None:
        self._wait(self.asks[i], self.ranks["fetch", i], len(self.asks[i]))  # the requests and the replies
        a, b = self._place(i)
        if self.staged:
            self.backend.copy_to_device(self.buffer[a:b], self.host[a:b])
        self.bytes.received(self.names[self.sched.items[i].unit], FETCH, (b - a) * self.host.itemsize)

    def push(self, i: int) -> None:
        a, b = self._place(i)
        if self.staged:
            self.backend.copy_to_host(self.host[a:b], self.buffer[a:b])
        elif self.backend.name != "numpy":
            self.backend.synchronize()  # CUDA-aware MPI reads the device buffer: the kernels must be done
        self.check(self.host[a:b])
        MPI.Prequest.Startall(self.pushes[i])
        self.bytes.sent(self.names[self.sched.items[i].unit], PS, (b - a) * self.host.itemsize)
        self._wait(self.pushes[i], self.ranks["push", i], 1)  # the place is reused by the next item

    def _wait(self, requests: list, ranks: list[int], messages: int) -> None:
        t0 = time.perf_counter()
        self.wait(requests, ranks)
        self.waited_s += time.perf_counter() - t0
        self.messages += messages


class FetchServer:
    """A server's answers to the workers' fetches of the units it holds part of: one request receive
    posted per worker, each answered at once and posted again.

    Parameters
    ----------
    ctx : Context
    layout : Layout
        With a schedule.
    params : numpy.ndarray
        The flat parameter buffer (of which this server's shard is current).
    bytes : ByteCounter
    rounds : RoundStream or None
        Under BSP, this server's rounds: a fetch waits until the version it names is closed here
        (``rounds.version``, the version the next round is applied at). None: answered at once.
    """

    def __init__(self, ctx, layout, params: np.ndarray, bytes, rounds=None):
        n = ctx.workers
        self.ctx, self.params, self.bytes, self.rounds = ctx, params, bytes, rounds
        self.names = _unit_names(layout)
        # per unit: the runs of the flat buffer this server sends for it, in unit order (none: not its)
        self.runs = [merge_runs([(layout.chunks[k].start, layout.chunks[k].stop) for server, _, chunks
                              in layout.unit_pieces(u) if server == ctx.rank for k in chunks])
                     for u in range(len(layout.schedule.units))]
        self.asked = [np.zeros(2) for _ in range(n)]  # (unit, version)
        self.waiting: list[int] = []  # workers whose fetch names a version not closed here yet
        self.recvs = [ctx.fetch_comm.Recv_init([self.asked[w], MPI.DOUBLE], ctx.worker_rank(w), FETCH_TAG)
                      for w in range(n)]
        largest = max(sum(b - a for a, b in runs) for runs in self.runs)
        self.out = [np.empty(largest, dtype=params.dtype) for _ in range(n)]
        self.sends: list = [None] * n
        MPI.Prequest.Startall(self.recvs)

    def take(self, last_heard: np.ndarray | None = None, now: float = 0.0) -> bool:
        """Answer the fetches that have arrived; True when some had. Rank 0 passes the times it last
        heard from each worker (its watchdog's), to set."""
        due = [w for w in self.waiting if self._due(w)]
        done = MPI.Request.Testsome(self.recvs)
        for w in done or ():
            if last_heard is not None:
                last_heard[w] = now
            if self._due(w):
                due.append(w)
            else:
                self.waiting.append(w)
        for w in due:
            if w in self.waiting:
                self.waiting.remove(w)
            self._answer(w)
            self.recvs[w].Start()
        # MPICH moves a large reply only while both ends poll: while one is in flight, poll again at once
        for w, r in enumerate(self.sends):
            if r is not None and r.Test():
                self.sends[w] = None
        return bool(done or due) or any(r is not None for r in self.sends)

    def _due(self, w: int) -> bool:
        """`w`'s fetch may be answered: not under BSP, or its version is closed here."""
        return self.rounds is None or self.asked[w][1] <= self.rounds.version

    def _answer(self, w: int) -> None:
        asked = self.asked[w][0]
        u = int(asked)
        if u != asked or not 0 <= u < len(self.runs) or not self.runs[u]:
            raise ProtocolError(f"fetch from rank {self.ctx.worker_rank(w)}: no unit {asked!r} held here "
                                f"(the schedule has {len(self.runs)}; rank {self.ctx.rank} holds part of "
                                f"{sum(map(bool, self.runs))})")
        if self.sends[w] is not None:  # its previous reply: received before this request was sent
            self.sends[w].Wait()
        out, at = self.out[w], 0
        for a, b in self.runs[u]:
            out[at:at + b - a] = self.params[a:b]
            at += b - a
        self.sends[w] = self.ctx.fetch_comm.Isend([out[:at], MPI.FLOAT], self.ctx.worker_rank(w), FETCH_TAG)
        self.bytes.sent(self.names[u], FETCH, at * out.itemsize)

    def close(self) -> None:
        """After every worker has stopped: withdraw the posted receives, complete the last replies."""
        for r in self.recvs:
            r.Cancel()
            r.Wait()
        for s in self.sends:
            if s is not None:
                s.Wait()
