"""A server's shard of the parameters: what every server rank does with its part of the model.

With ``runtime.servers = k`` the ``ParamSpace``'s chunks are dealt to the k servers in contiguous
shards (``protocol.plan_shards``); with one server its shard is the whole model. A :class:`ShardStore`
is the shard's transport around its update: the update itself (optimizer state, staleness rule,
DC-ASGD, version bookkeeping, a round's mean) is the pure ``nn.shard_update``, which the emulated
trainer uses too; the receives of every worker's next push are ``runtime.servers.push_receives``; the store
keeps the pull replies in flight, the snapshots they send from and the byte counts. It applies a push
or a BSP round and answers a pull when an order says (``runtime.servers.executor``, on every server rank). It
never decides anything itself.

Buffers are allocated at the model's full size and indexed by the flat offsets, so every rank uses
the chunks' own offsets; only the shard's range is ever written, so the rest of each buffer is
never touched (its pages are never mapped).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from mpi4py import MPI

from ... import build
from ...nn.factors import rebuild_gradient
from ...nn.shard_update import ShardUpdate
from ...nn.staleness import StalenessRule
from ...nn.versions import VersionStore
from .push_receives import Arrivals, PushReceives
from .round_stream import ClosedRound, RoundStream, streams
from ..transport.failures import JobFailure
from ..transport.hybrid import PS, ByteCounter, Stacked
from ..transport.protocol import CHUNK_TAG0, PULL_TAG, PUSH, Shard


#: a streamed BSP round: the bytes of each worker's push whose receives are posted ahead, in chunks
#: (at least 2): enough to cover a link's queue (expect_push)
PACE_BYTES = 2 << 20


@dataclass(eq=False)
class PendingReply:
    """A pull reply in flight: its requests keep the buffer sent (a snapshot, or the parameters under
    BSP) and the header alive until they complete.

    Compared by identity (``eq=False``): two replies to one worker can be in flight at once (its
    previous reply's sends not yet seen complete), and a field-wise ``==`` would compare their arrays
    and raise instead of answering ``r in finished``."""

    worker: int
    requests: list
    snapshot: np.ndarray
    header: np.ndarray | None


class ShardStore:
    """The parameters, optimizer state and messages of one server's shard.

    Parameters
    ----------
    ctx : Context
        This rank's place in the job (``ctx.worker_rank`` maps worker indices to ranks).
    job : JobConfig
    params : numpy.ndarray
        The whole flat parameter buffer (initialised from the seed); this store updates its shard.
    layout : Layout
        The run's messages and shards (``runtime.layout``); this store is ``layout.shards[server]``.
    server : int
        This server's rank.
    round_based : bool
        The sync policy applies rounds (BSP), streamed chunk by chunk (``runtime.servers.round_stream``).
    version : int
        The model version the run goes on from (0, or a checkpoint's): a round's learning rate.
    """

    def __init__(self, ctx, job, params: np.ndarray, layout, server: int, round_based: bool, version: int = 0):
        shard: Shard = layout.shards[server]
        self.ctx, self.shard, self.n = ctx, shard, ctx.workers
        self.params = params
        self.lo, self.hi = shard.lo, shard.hi
        self.update = _shard_update(job, params, shard, round_based)
        self.chunks = layout.chunks[shard.first:shard.stop]
        self.layout = layout
        self.sfb = [a for a in layout.sfb if layout.server_of_layer(a) == server]
        sfb_names = {a.name for a in self.sfb}
        self.pushed_chunks = [c for c in self.chunks if layout.chunk_tensor[c.tag - CHUNK_TAG0] not in sfb_names]
        # no reply carries an OSDP on-demand unit (a worker fetches it when it computes with it)
        self.fetched = fetched = {k for k, f in enumerate(layout.fetched) if f}
        self.first_chunks = [c for c in self.chunks if c.tag - CHUNK_TAG0 not in fetched]
        # after the first pull, no BSP reply carries an SFB layer: every worker steps it itself
        self.reply_chunks = [c for c in self.pushed_chunks if c.tag - CHUNK_TAG0 not in fetched] \
            if layout.sfb_bsp else self.first_chunks
        self.pulled = np.zeros(self.n, dtype=bool)  # each worker has had its first (whole) reply
        self.factors = Stacked(self.sfb, self.n, job.data.batch_size) if self.sfb else None
        self.bytes = ByteCounter()
        # messages counted one by one, their bytes added up when the counts are read (_settle_counts)
        self.sends_of_chunk: dict[int, list[int]] = {}  # chunk index -> [reply sends, bytes each]
        self.bytes.defer(self._settle_counts)
        self.stream = RoundStream(self, version, streams(job.runtime.stream_rounds, ctx)) if round_based else None
        # a streamed round paces the pushes (expect_push), but not OSDP's: a worker sends an on-demand
        # unit's gradient from its fetch buffer and waits for that send before it fetches the next unit
        # into it, so a receive posted later than the send would never be posted (a hang, seen)
        paced = self.stream is not None and self.stream.early and layout.schedule is None
        self.receives = PushReceives(ctx, params, self.pushed_chunks, self.factors, self.stream,
                                     max(2, PACE_BYTES // layout.chunk_bytes) if paced else None,
                                     _send_order(self.pushed_chunks, layout, job.runtime.wait_free_backprop))
        self.replies: list[PendingReply] = []
        self.current: np.ndarray | None = None  # the snapshot replies go out from until the shard changes
        self.free_snapshots: list[np.ndarray] = []  # neither current nor sent by a reply in flight

    # -- pushes ---------------------------------------------------------------------------------

    def expect_push(self, w: int) -> None:
        """Post the receives of `w`'s next push (``PushReceives.expect_push``)."""
        self.receives.expect_push(w)

    def paced(self, source: int, tag: int) -> bool:
        """A message from `source` with `tag` is a chunk of a push posted in its turn, not yet."""
        return self.receives.paced(source, tag)

    def take_parts(self, last_heard: np.ndarray | None = None, now: float = 0.0) -> Arrivals:
        """Take the parts of pushes that have arrived (``PushReceives.take_parts``)."""
        return self.receives.take_parts(last_heard, now)

    def rejected(self, w: int, iteration: int) -> bool:
        """Whether `w`'s complete push, its `iteration`-th, is rejected (``PushReceives.rejected``)."""
        return self.receives.rejected(w, iteration)

    @property
    def grads(self) -> list[np.ndarray]:
        """Per worker, the gradient of its push (whole-model buffers; this shard's chunks written)."""
        return self.receives.grads

    @property
    def headers(self) -> list[np.ndarray]:
        """Per worker, the header of its push."""
        return self.receives.headers

    def corrected_step_finite(self, w: int) -> bool:
        """Under ``optim.staleness = dc``, whether `w`'s delay-compensated step on this shard, worked
        out on the weights as they are now, is finite (True under any other rule: the header's check
        is the step's). A push is never applied with a step that is not finite: rank 0 rejects it,
        as one whose gradient is not finite. The step is kept for :meth:`apply` while the weights
        stay as they are (an asynchronous push is applied in the event it arrives in)."""
        return self.update.step_finite(w, self._gradient(w)[self.lo:self.hi]) if self.update.dc else True

    def _gradient(self, w: int) -> np.ndarray:
        """`w`'s pushed gradient, its SFB layers rebuilt from their factors (Project Adam's factor push)."""
        grad = self.grads[w]
        for a in self.sfb:
            rows = self.factors.rows(w)
            rebuild_gradient(self.factors.V[a.name][rows], self.factors.U[a.name][rows],
                             grad[a.params].reshape(a.d_in, a.d_out))
        return grad

    def apply(self, w: int, version: int) -> None:
        """Apply `w`'s push as one optimizer step, at the learning rate of `version` (``nn.shard_update``).

        Raises
        ------
        JobFailure
            Under ``optim.staleness = dc``, a corrected step that is not finite where no check could
            reject it (a shard of a run with several servers, each of which sees only its own part):
            the run stops in one line rather than apply it.
        """
        self._shard_changes()
        used = int(self.headers[w][PUSH.version])  # the version the gradient was computed on
        if not self.update.apply(w, self._gradient(w)[self.lo:self.hi], version, used):
            iteration = int(self.headers[w][PUSH.iteration])
            raise JobFailure(f"the delay-compensated step of worker {w}'s push {iteration} is not finite on "
                             f"server rank {self.ctx.rank}'s shard (optim.dc_lambda = {self.update.rule.dc_lambda:g}), "
                             f"where no check could reject it: the training diverged; lower optim.dc_lambda or "
                             f"optim.lr")

    @property
    def opt(self):
        """The shard's optimizer (its ``velocity`` is the optimizer state)."""
        return self.update.opt

    @property
    def round_open(self) -> bool:
        """A BSP round streams: some of its chunks are applied, others not yet."""
        return self.stream is not None and self.stream.open

    @property
    def redone_rounds(self) -> int:
        """BSP rounds redone, their weights sent twice (``runtime.servers.round_stream``)."""
        return self.stream.redone if self.stream is not None else 0

    def stream_ready(self, backoff, on_idle) -> bool:
        """BSP: apply and send the chunks of the open round that every worker of it has pushed
        (``round_stream``); True when any was."""
        return self.stream.apply_ready(lambda: self.settle(backoff, on_idle))

    def close_round(self, members, version: int, backoff, on_idle) -> ClosedRound:
        """BSP: the round closes with `members` at `version` (the mean of their gradients, summed in
        worker order, as one optimizer step, at the learning rate of `version`; no step without
        members); returns each recipient's chunk sends, which its reply joins (:meth:`reply`). Per
        element the arithmetic is that of one step over the whole buffer."""
        return self.stream.close(members, version, lambda: self.settle(backoff, on_idle), backoff, on_idle)

    # -- pull replies ---------------------------------------------------------------------------

    def reply_buffer(self) -> np.ndarray:
        """The buffer pull replies are sent from: the same one until a push or a round is applied.

        Under a round-based policy (BSP) the parameters change only when a round completes, that is
        when every worker in it has received its previous reply and pushed again; the replies then go
        out from the parameters themselves, and :meth:`settle` completes any still sending before the
        round is applied. Otherwise a push may be applied while replies are in flight, and they go out
        from a snapshot of the shard: one serves every reply until the shard changes (rank 0's and
        the other servers' replies alike), and it is written again only once it is neither current
        nor sent by a reply in flight.
        """
        if self.stream is not None:  # while a round streams, a (stop) reply sends the weights before it
            return self.params if not self.stream.open else self.before_round(self.params)
        if self.current is None:
            self.current = self.free_snapshots.pop() if self.free_snapshots else np.empty_like(self.params)
            np.copyto(self.current[self.lo:self.hi], self.params[self.lo:self.hi])
        return self.current

    def before_round(self, array: np.ndarray) -> np.ndarray:
        """A buffer like `array` (the weights or the momentum) whose shard is as it was before the open
        BSP round (as it is, outside one or under another policy)."""
        out = np.empty_like(array)
        if self.stream is not None and self.stream.open:
            undo = self.stream.undo_params if array is self.params else self.stream.undo_velocity
            out[self.lo:self.hi] = self.stream.before_round(array, undo, self.lo, self.hi)
        else:
            out[self.lo:self.hi] = array[self.lo:self.hi]
        return out

    def _shard_changes(self) -> None:
        """The shard is about to change: the current snapshot stops being current, and is free once no
        reply sends from it (at once, or when its last reply completes)."""
        snapshot, self.current = self.current, None
        if snapshot is not None:
            self._free_if_unused(snapshot)

    def _free_if_unused(self, snapshot: np.ndarray) -> None:
        if self.stream is not None:  # a stop reply's copy of the weights before a round: not kept for reuse
            return
        if snapshot is not self.current and all(r.snapshot is not snapshot for r in self.replies):
            self.free_snapshots.append(snapshot)

    def reply(self, w: int, buffer: np.ndarray, stop: bool, head: np.ndarray | None = None,
              sent: list | None = None, last: bool = False) -> PendingReply:
        """Answer `w`'s pull: post the receives of its next push (unless `stop`; `last`: that push will
        be its last), send `head` (rank 0's reply header) and this shard's weights from `buffer`, unless
        a BSP round sent them already (`sent`: those sends, :meth:`close_round`). A worker's first reply
        holds every tensor; later ones leave out BSP's SFB layers."""
        if not stop:
            self.expect_push(w)
            if self.stream is not None:
                self.stream.expect(w, last)
        elif self.stream is not None and sent is None:  # a stop reply before its round closes
            self.stream.answer(w)
        self.update.let_go(w)  # the version its last push was computed on (taken by now)
        if not stop:
            self.update.hold(w)
        comm, rank = self.ctx.comm, self.ctx.worker_rank(w)
        requests = list(sent or ())
        if head is not None:
            requests.append(comm.Isend([head, MPI.DOUBLE], rank, PULL_TAG))
        if sent is None:
            for c in self.reply_chunks if self.pulled[w] else self.first_chunks:
                requests.append(comm.Isend([buffer[c.start:c.stop], MPI.FLOAT], rank, c.tag))
                self.count_sent(c)
        self.pulled[w] = True
        reply = PendingReply(w, requests, buffer, head)
        self.replies.append(reply)
        return reply

    def count_sent(self, c, n: int = 1) -> None:
        sends = self.sends_of_chunk.get(c.tag)
        if sends is None:
            sends = self.sends_of_chunk[c.tag] = [0, c.size * self.params.itemsize]
        sends[0] += n

    def _settle_counts(self) -> None:
        """Add the bytes of the parts received and the chunks sent so far to the byte counter."""
        itemsize = self.params.itemsize
        self.receives.settle_counts(self.bytes, self.layout, itemsize)
        for tag, (n, _) in self.sends_of_chunk.items():
            for tensor, elements in self.layout.parts(tag - CHUNK_TAG0):
                self.bytes.sent(tensor, PS, n * elements * itemsize)
        self.sends_of_chunk = {}

    def complete_replies(self) -> bool:
        """Take the replies whose sends have completed; True when any send of a reply completed
        (a whole reply or one of its chunks: the caller then polls again at once, since MPICH moves a
        large message only while both ends poll)."""
        progressed, finished = False, []
        for r in self.replies:
            done = MPI.Request.Testsome(r.requests)  # None: no request was left active
            if done is None or done:
                progressed = True
                # a completed send's request is MPI_REQUEST_NULL, which is falsy; looked at only
                # when some send completed, since the server's loop calls this at every turn
                if done is None or not any(r.requests):
                    finished.append(r)
        if not finished:
            return progressed
        self.replies = [r for r in self.replies if r not in finished]
        # each snapshot once, however many of its replies finished now
        done = {id(r.snapshot): r.snapshot for r in finished if r.snapshot is not self.params}
        for snapshot in done.values():
            self._free_if_unused(snapshot)
        return True

    def settle(self, backoff, on_idle) -> None:
        """Complete every reply still sending from the parameters, before they change (MPI forbids
        changing a buffer whose send has not completed; its receiver has the data already, or is
        polling for it). ``on_idle()`` runs between polls (the watchdog: a worker that died before
        taking its reply)."""
        while any(r.snapshot is self.params for r in self.replies):
            if self.complete_replies():
                backoff.reset()
                continue
            on_idle()
            backoff.idle()

    def replying_to(self) -> list[int]:
        """The workers whose replies are still sending."""
        return [r.worker for r in self.replies]


def _send_order(chunks, layout, wait_free: bool) -> list[int]:
    """The indices of `chunks` in the order a worker sends them: with wait-free backprop, a tensor's
    chunks as the backward pass makes it final, the last layer's first (tensors lie in the buffer in
    forward order), and the chunks that join small tensors after the backward pass
    (``wire_dense.DenseWire``); without it, in buffer order."""
    if not wait_free:
        return list(range(len(chunks)))
    start = {}  # each tensor's first element among the chunks of it alone
    for c in layout.chunks:
        parts = layout.parts(c.tag - CHUNK_TAG0)
        if len(parts) == 1:
            start[parts[0][0]] = min(start.get(parts[0][0], c.start), c.start)

    def key(j: int):
        c = chunks[j]
        parts = layout.parts(c.tag - CHUNK_TAG0)
        return (1, 0, c.start) if len(parts) > 1 else (0, -start[parts[0][0]], c.start)
    return sorted(range(len(chunks)), key=key)


def _shard_update(job, params: np.ndarray, shard: Shard, round_based: bool) -> ShardUpdate:
    """The update of `shard` (``optim.*``). DC-ASGD reads the weights each push was computed on: this
    shard's part of every version a worker holds is kept, counted in local steps, so that a resumed
    run needs none of it back. A BSP round is never stale: no versions kept."""
    rule = StalenessRule(job.optim.staleness, job.optim.dc_lambda)
    versions = VersionStore(params[shard.lo:shard.hi]) if rule.needs_pulled_weights and not round_based else None
    return ShardUpdate(params, build.optimizer(job, params.size), build.schedule(job), rule, shard.lo, shard.hi,
                       versions, round_based)
