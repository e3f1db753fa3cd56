"""BSP rounds streamed: each chunk of a round applied and sent back while later chunks still arrive.

Under BSP a server's link carries every worker's push in and every worker's reply out, once per
round. Applied only once the last push is whole, the replies leave after every push came in: the
link carries one direction at a time and a round takes about twice its bandwidth bound
(docs/cluster.md). A :class:`RoundStream` applies a chunk of the round, and sends it to the round's
workers, as soon as every worker of the round has pushed that chunk, so replies leave while later
chunks' pushes still arrive.

Who is in the round is known before its pushes are whole: every worker whose push this server awaits
(BSP releases no worker before the round closes). Whose push is *accepted* is not: a push whose
header says NaN or Inf is rejected whole, and the header comes last. A chunk is therefore applied on
the members known so far, its old weights and momentum kept. When a header then rejects a push whose
gradient a streamed chunk already holds, the round is *redone* at its close: every streamed chunk is
restored, the round is applied again on its members, and the workers get the weights twice, the
second time corrected, which the reply header tells them (``PULL.redo``). So the weights after a round
are always those of the round applied once on its members, in worker order, chunk by chunk (the same
float operations as the single-process oracle's); a redo costs one more reply (rare: a NaN push).

A worker whose push is its last (its iteration limit) gets its stop reply at once, or with the round
where its push closes it (``sync.coordinator``): no streamed chunk goes to it. A stop reply sent
while the round streams goes from a copy of the weights before the round
(:meth:`RoundStream.before_round`); one that comes with the round gets every chunk at the close.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
from mpi4py import MPI

from ...nn.factors import rebuild_gradient
from ..transport.polling import wait_all
from ..transport.protocol import CHUNK_TAG0, ProtocolError


def streams(setting: bool | str, ctx, server: int | None = None) -> bool:
    """Whether server rank `server` (default: this rank) streams its rounds (``runtime.stream_rounds``):
    as set, or with ``"auto"`` where some worker runs on another node than that server. Over a network
    link streaming lets the two directions overlap (one server alone at 200 Mbit/s: 0.57 of the bound closed whole, 0.72
    streamed; docs/cluster.md). Through shared memory there are no two directions to overlap, and MPI
    copies a chunk only while both ends poll: `bench ps` on one node reached 0.32 - 0.55 x raw MPI
    streamed against 0.51 - 0.71 closed whole (medians; docs/performance.md). Hosts not known: one
    node."""
    if setting != "auto":
        return bool(setting)
    here = ctx.hosts[ctx.rank if server is None else server] if ctx.hosts else None
    return bool(ctx.hosts) and any(ctx.hosts[ctx.worker_rank(w)] != here for w in range(ctx.workers))


class ClosedRound(NamedTuple):
    """A round's end on one server: each recipient's chunk sends (to join its reply), and whether the
    weights went twice (the reply header's ``redo``)."""

    sends: dict[int, list]
    redo: bool


class RoundStream:
    """One server's BSP rounds, chunk by chunk (see the module docstring).

    Parameters
    ----------
    store : ShardStore
        The shard whose pushed chunks, gradients, optimizer and byte counts the rounds use.
    version : int
        The model version the next round is applied at (its learning rate): 0, or a checkpoint's.
    early : bool
        Apply and send chunks before the round closes (:func:`streams`); False: every chunk
        at the close, as one step after the last push.
    """

    def __init__(self, store, version: int, early: bool = True):
        self.store, self.version, self.early = store, int(version), early
        n = store.n
        self.chunks = store.pushed_chunks
        self.expected = np.zeros(n, dtype=bool)  # the round's workers: their push is due here
        self.last = np.zeros(n, dtype=bool)  # ... whose push is their last: their reply is their own
        self.rejected = np.zeros(n, dtype=bool)  # ... whose header said NaN or Inf
        self.whole = np.zeros(n, dtype=bool)  # ... whose push is whole here
        self.answered = np.zeros(n, dtype=bool)  # ... who had their (stop) reply before the round closed
        self.due = 0  # workers in the round
        self.arrived = np.zeros(len(self.chunks), dtype=np.int64)  # per chunk, the round's pushes of it in
        self.applied = np.zeros(len(self.chunks), dtype=bool)
        self.ready: list[int] = []  # chunks every worker of the round has pushed, not applied yet
        self.sends: dict[int, list] = {}  # recipient -> the round's chunk sends so far
        self.redo = False
        self.redone = 0  # rounds redone in the run
        self.undo_params = np.empty_like(store.params)  # a streamed chunk's weights and momentum before it
        self.undo_velocity = np.empty_like(store.opt.velocity)

    @property
    def all_in(self) -> bool:
        """Every push of the round is whole here (a server of one shard closes it then)."""
        return bool(self.whole[self.expected].all())

    @property
    def open(self) -> bool:
        """Some chunk of the round is applied, and the round is not closed."""
        return bool(self.applied.any())

    # -- what arrives -----------------------------------------------------------------------------

    def expect(self, w: int, last: bool) -> None:
        """`w` is in the next round (its reply is going out); `last`: its push will be its last. Every
        worker of a round is expected before any of its chunks is taken in: the replies that open a
        round go out together (rank 0's in one decision, the other servers' in one order message)."""
        if self.arrived.any():
            raise ProtocolError(f"worker {w} joins a round whose chunks are arriving already")
        if not self.expected[w]:
            self.due += 1
        self.expected[w], self.last[w] = True, last

    def chunk_in(self, j: int) -> bool:
        """A worker's chunk `j` (an index of ``store.pushed_chunks``) has come; True when every worker
        of the round has pushed it now."""
        self.arrived[j] += 1
        if self.arrived[j] != self.due:
            return False
        if self.early:
            self.ready.append(j)
        return True

    def header_in(self, w: int, finite: bool) -> None:
        """`w`'s header has come: its push is rejected where it is not `finite`. A streamed chunk holds
        its gradient already: the round must be redone at its close."""
        if not finite:
            self.rejected[w] = True
            self.redo |= self.open

    def push_in(self, w: int) -> None:
        """`w`'s push is whole."""
        self.whole[w] = True

    def answer(self, w: int) -> None:
        """`w` has its stop reply before the round closes: the round sends it nothing."""
        self.answered[w] = self.expected[w]

    # -- applying ---------------------------------------------------------------------------------

    def apply_ready(self, settle) -> bool:
        """Apply and send the chunks every worker of the round has pushed; True when any was.
        ``settle()`` first completes the replies still sending from the weights (a previous round's)."""
        if not self.ready:
            return False
        members = np.flatnonzero(self.expected & ~self.rejected)
        if not len(members):  # every push known so far is rejected: nothing to apply before the close
            return False
        if not self.open:
            settle()
        early = self.expected & ~self.last
        for j in self.ready:
            self._apply(j, members, keep=True)
            self._send(j, early)
        self.ready.clear()
        return True

    def close(self, members, version: int, settle, backoff, on_idle) -> ClosedRound:
        """The round closes with `members` (rank 0's decision, in worker order) at `version`: apply
        every chunk not applied yet (all of them again after a rejection the streamed ones did not
        know), send the rest, and start the next round. Raises ProtocolError where this server's
        headers disagree with rank 0's decision."""
        mine = tuple(int(w) for w in np.flatnonzero(self.expected & ~self.rejected))
        if tuple(members) != mine or version != self.version:
            raise ProtocolError(f"round at version {version} with members {list(members)}; this server expected "
                                f"version {self.version}, members {list(mine)}")
        if not self.open:
            settle()
        sent_early = self.applied.copy()
        if self.redo:  # the streamed chunks' sends complete, then their weights go back to before the round
            wait_all([r for sends in self.sends.values() for r in sends], backoff, on_idle=on_idle)
            self._restore(sent_early)
        early, late = self.expected & ~self.last, self.expected & self.last & ~self.answered
        recipients = early | late  # late: stopped by their limit, and their stop reply is this round's
        for w in np.flatnonzero(recipients):  # every recipient, whatever it is sent
            self.sends.setdefault(int(w), [])
        members = np.asarray(members, dtype=np.int64)
        if len(members):
            self._apply_factor_layers(members)
        for j in range(len(self.chunks)):
            if not self.applied[j]:
                self._apply(j, members, keep=False)
            self._send(j, late if sent_early[j] else recipients)
        redo = self.redo
        if redo:  # the corrected weights, all of them, after the first set
            self.redone += 1
            for j in range(len(self.chunks)):
                self._send(j, recipients)
        if len(members):
            self.version += 1
        sends = self.sends
        self._next_round()
        return ClosedRound(sends, redo)

    def _apply(self, j: int, members, keep: bool) -> None:
        """Chunk `j` of the round's mean as its optimizer step (none without members); `keep`: its weights
        and momentum before the step are kept, for a redo or a copy of the weights before the round."""
        store, c = self.store, self.chunks[j]
        if len(members):
            s = slice(c.start, c.stop)
            if keep:
                np.copyto(self.undo_params[s], store.params[s])
                np.copyto(self.undo_velocity[s], store.opt.velocity[s])
            store.update.round_step([store.grads[w] for w in members], s, self.version)
        self.applied[j] = True

    def _apply_factor_layers(self, members) -> None:
        """The SFB layers this server owns: rebuilt from the members' factors in worker order (one GEMM)
        and stepped, at the close (their factors are not chunks)."""
        store, update = self.store, self.store.update
        lr, mean = update.lr_at(self.version), update.mean_buf
        for a in store.sfb:
            V, U = store.factors.of(a, list(members))
            rebuild_gradient(V, U, mean[a.params].reshape(a.d_in, a.d_out), scale=1.0 / len(members))
            update.opt.step(store.params[a.params], mean[a.params], lr, offset=a.offset)

    def _send(self, j: int, to: np.ndarray) -> None:
        """Send chunk `j` of the weights to the workers `to` (a mask; an OSDP on-demand unit's chunk is
        fetched when used, never sent)."""
        store, c = self.store, self.chunks[j]
        if c.tag - CHUNK_TAG0 in store.fetched:
            return
        comm, piece = store.ctx.comm, [store.params[c.start:c.stop], MPI.FLOAT]
        recipients = np.flatnonzero(to)
        for w in recipients:
            self.sends.setdefault(int(w), []).append(comm.Isend(piece, store.ctx.worker_rank(int(w)), c.tag))
        store.count_sent(c, len(recipients))

    def _restore(self, chunks: np.ndarray) -> None:
        store = self.store
        for j in np.flatnonzero(chunks):
            c = self.chunks[j]
            s = slice(c.start, c.stop)
            np.copyto(store.params[s], self.undo_params[s])
            np.copyto(store.opt.velocity[s], self.undo_velocity[s])
        self.applied[:] = False

    def _next_round(self) -> None:
        for mask in (self.expected, self.last, self.rejected, self.whole, self.answered):
            mask[:] = False
        self.due = 0
        self.arrived[:] = 0
        self.applied[:] = False
        self.ready.clear()
        self.sends = {}
        self.redo = False

    # -- the weights before the round -------------------------------------------------------------

    def before_round(self, array: np.ndarray, undo: np.ndarray, lo: int, hi: int) -> np.ndarray:
        """A copy of ``array[lo:hi]`` (the weights or their momentum) as it was before the open round:
        what a stop reply, an evaluation or a checkpoint must see while chunks of the round are applied."""
        out = array[lo:hi].copy()
        for j in np.flatnonzero(self.applied):
            c = self.chunks[j]
            out[c.start - lo:c.stop - lo] = undo[c.start:c.stop]
        return out
