"""Rank 0: the parameter server and the sync scheduler.

It owns the global parameters and the optimizer state, keeps a receive posted for every part of every
worker's next push, applies pushes as they complete, asks the sync policy whose pull to answer, and
answers pulls from buffers that never change while a send of them is in flight (DESIGN.md, "Roles"):
snapshots of the parameters, or under BSP the parameters themselves, which only a completed round
changes, after every reply still sending from them has completed.

The message loop polls (``Testsome``) instead of blocking, so that between messages it can evaluate the
model one slice at a time, watch for stalled workers, flush the trace and report progress.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import numpy as np
from mpi4py import MPI

from .. import build
from ..checkpoint import LAST_LOSS, TOTALS, Checkpoint, write_checkpoint
from ..config import JobConfig, to_dict
from ..errors import UsageError
from ..nn.average import round_mean
from ..nn.factors import rebuild_gradient
from ..nn.kernels import all_finite
from ..outputs import AccuracyTargets, build_summary, write_model, write_summary
from ..progress import Progress
from ..sync.registry import make_policy
from .comm import Context, StallError, mpi_library, open_rank_trace, terminate_requested, wait_all
from .evaluator import Evaluator
from .faults import fault_for
from .hybrid import PS, SFB, ByteCounter, Stacked, sfb_layers, tensor_of_chunks
from .protocol import (ALIVE_TAG, CHUNK_TAG0, PULL_FIELDS, PULL_TAG, PUSH, PUSH_FIELDS, PUSH_TAG, STATS_TAG,
                       ProtocolError, header, pack, plan_chunks)

log = logging.getLogger(__name__)

#: seconds between housekeeping passes (watchdog, keep-alives, eval start, trace flush, progress, stray messages)
HOUSEKEEPING_S = 0.05
#: what a keep-alive carries (nothing a worker reads; never written, so always safe to send)
_ALIVE = np.zeros(1)


@dataclass(eq=False)
class _PendingReply:
    """A pull reply in flight: its requests keep the buffer sent (a snapshot, or the parameters under
    BSP) and the header alive until they complete.

    Compared by identity (``eq=False``): two replies to one worker can be in flight at once (its
    previous reply's sends not yet seen complete), and a field-wise ``==`` would compare their arrays
    and raise instead of answering ``r in finished``."""

    worker: int
    requests: list
    snapshot: np.ndarray
    header: np.ndarray
    t: float


class Server:
    """Serve one training run; :meth:`run` returns the summary (also written to ``summary.json``)."""

    def __init__(self, ctx: Context, job: JobConfig, run_dir, show_progress: bool = True,
                 resume: Checkpoint | None = None):
        self.ctx, self.job, self.run_dir = ctx, job, run_dir
        n = self.n = ctx.workers
        self.ds = build.dataset(job)
        model = build.model(job, self.ds)  # the server's copy: parameters, layout, init from the seed
        self.space = model.space
        self.params = model.space.data
        self.opt = build.optimizer(job, self.space.size)
        self.lr_at = build.schedule(job)
        self.policy = make_policy(job.sync, n, seed=job.seed)
        self.chunks = plan_chunks([(t.offset, t.size) for t in self.space.tensors], self.params.itemsize,
                                  ctx.chunk_bytes(job.runtime.chunk_bytes), ctx.comm.Get_attr(MPI.TAG_UB))
        self.limits = [build.iteration_limit(job, build.batch_stream(job, self.ds, w, n).batches_per_epoch)
                       for w in range(n)]
        # comm.hybrid: the dense layers whose gradient travels as sufficient factors (runtime.hybrid)
        sfb_names, self.hybrid_plan = build.hybrid_plan(job, model, n)
        self.sfb = sfb_layers(self.space, sfb_names)
        self.sfb_bsp = bool(self.sfb) and self.policy.round_based
        if self.sfb_bsp:  # every replica applies the same rounds: all must stop at the same one
            self.limits = [None if None in self.limits else min(self.limits)] * n
        self.chunk_tensor = tensor_of_chunks(self.space, self.chunks)
        pushed = [c for c, t in zip(self.chunks, self.chunk_tensor, strict=True) if t not in sfb_names]
        # under BSP the workers apply the SFB layers' steps themselves: after the first pull, no reply
        # carries those layers
        self.reply_chunks = pushed if self.sfb_bsp else self.chunks
        self.pulled = np.zeros(n, dtype=bool)  # each worker has had its first (whole) reply
        self.factors = Stacked(self.sfb, n, job.data.batch_size) if self.sfb else None
        self.reply_len = len(PULL_FIELDS) + (n if self.sfb_bsp else 0)  # BSP with SFB: the round's members
        self.round_mask = np.zeros(n)
        self.bytes = ByteCounter()
        if self.sfb:
            log.info("comm.hybrid = %s: sufficient factors for %s", job.comm.hybrid,
                     ", ".join(a.name for a in self.sfb))
        self.evaluator = Evaluator(build.model(job, self.ds), self.ds.x_test, self.ds.y_test,
                                   job.eval.batch_size)
        self.targets = AccuracyTargets(list(job.eval.targets))
        self.last_eval = (None, None)  # (test loss, test accuracy) of the latest evaluation
        self.evals: list[tuple] = []  # (t, version, test loss, test accuracy) of every evaluation

        # one gradient buffer and header per worker, with persistent receives for every part of a push
        self.grads = [np.empty_like(self.params) for _ in range(n)]
        self.push_headers = [header(PUSH_FIELDS) for _ in range(n)]
        self.recvs: list[MPI.Prequest] = []
        # request index -> (worker, expected count, MPI datatype, gradient chunk or factor block, tensor, scheme)
        self.part_of: list[tuple] = []
        for w in range(n):
            for c in pushed:
                piece = self.grads[w][c.start:c.stop]
                self.recvs.append(ctx.comm.Recv_init([piece, MPI.FLOAT], w + 1, c.tag))
                self.part_of.append((w, c.size, MPI.FLOAT, piece, self.chunk_tensor[c.tag - CHUNK_TAG0], PS))
            if self.sfb:
                for req, name, piece in self.factors.receives(ctx.factor_comm, lambda q: q + 1, [w]):
                    self.recvs.append(req)
                    self.part_of.append((w, piece.size, MPI.FLOAT, piece, name, SFB))
            self.recvs.append(ctx.comm.Recv_init([self.push_headers[w], MPI.DOUBLE], w + 1, PUSH_TAG))
            self.part_of.append((w, len(PUSH_FIELDS), MPI.DOUBLE, None, None, None))
        self.parts = len(self.recvs) // n
        self.statuses = [MPI.Status() for _ in self.recvs]
        self.missing = np.zeros(n, dtype=np.int64)  # parts of the current push not yet arrived
        self.bad = np.zeros(n, dtype=bool)  # a chunk of the current push held NaN or Inf
        self.mean_buf = np.empty_like(self.params) if self.policy.round_based else None  # a round's mean
        self.round_members: list[int] = []

        self.version = 0
        self.pushes = np.zeros(n, dtype=np.int64)
        self.rejected = 0
        self.left: set[int] = set()
        self.pull_requested = np.zeros(n)  # when each worker's pending pull arrived (its push time)
        self.last_heard = np.zeros(n)
        self.last_told = np.zeros(n)  # when the server last sent each worker a reply or a keep-alive
        self.alive_sends: list = []  # keep-alive sends in flight
        self.replies: list[_PendingReply] = []
        self.free_snapshots: list[np.ndarray] = []
        self.last_loss = np.full(n, np.nan)
        self.stats: list[dict | None] = [None] * n  # what each worker reports once it has stopped
        # per worker, seconds of compute, waiting and injected delay of its pushes taken in (from their
        # headers), for checkpoints; and what a resumed run had done before this process started
        self.totals = {name: np.zeros(n) for name in TOTALS}
        self.resumed_totals = {name: np.zeros(n) for name in TOTALS}
        self.stopping = False  # SIGTERM: checkpoint, then stop every worker at its next pull
        self.flush_asked = np.zeros(n, dtype=bool)  # a checkpoint was written: flush your trace
        self.next_checkpoint = job.checkpoint.every_seconds or np.inf
        self.trace = open_rank_trace(ctx, job, run_dir, role="server", backend="numpy", device="cpu",
                                     append=resume is not None)
        self.fault = fault_for(0, ctx.size)  # EBSP_INJECT_FAULT, to test the failure paths
        if resume is not None:
            self._restore(resume)
        total = sum(self.limits) if all(lim is not None for lim in self.limits) else None
        self.progress = Progress(total, enabled=show_progress)

    # -- the run --------------------------------------------------------------------------------

    def run(self) -> dict:
        job, backoff = self.job, self.ctx.backoff()
        log.info("server: %s with %d workers, %d parameters in %d messages per push, stop at %s iterations",
                 self.policy.name, self.n, self.space.size, self.parts, self.limits)
        self.trace.set_attrs(clock_offset_s=0.0)
        t = self.ctx.now()
        self.last_heard[:] = t
        self.last_told[:] = t
        self.pull_requested[:] = t
        self.next_checkpoint += t  # a resumed run's clock goes on from its checkpoint
        self._decide(self.policy.start(t), t)
        next_housekeeping = 0.0
        next_eval = t + job.eval.every_seconds
        while len(self.left) < self.n or self.replies:
            progressed = self._serve_pushes()
            progressed |= self._complete_replies()
            if self.evaluator.active:
                self._eval_slice()
                progressed = True
            now = self.ctx.now()
            if now >= next_housekeeping:
                self._housekeeping(now)
                next_housekeeping = now + HOUSEKEEPING_S
            if now >= next_eval and not self.evaluator.active:
                self.evaluator.start(self.params, self.version, now)
                next_eval = now + job.eval.every_seconds
            if progressed:
                backoff.reset()
            else:
                backoff.idle()
        return self._finish()

    def _serve_pushes(self) -> bool:
        done = MPI.Request.Testsome(self.recvs, self.statuses)
        if not done:
            return False
        now = self.ctx.now()
        for k, i in enumerate(done):  # statuses[k] belongs to done[k], as in MPI_Testsome
            w, expected, datatype, piece, tensor, scheme = self.part_of[i]
            count = self.statuses[k].Get_count(datatype)
            if count != expected:
                raise ProtocolError(f"push from rank {w + 1}: message with tag {self.statuses[k].Get_tag()} "
                                    f"has {count} values, expected {expected}")
            if piece is not None:
                self.bytes.received(tensor, scheme, piece.nbytes)
                if not all_finite(piece):  # checked now, while the chunk is in cache
                    self.bad[w] = True
            self.last_heard[w] = now
            self.missing[w] -= 1
            if self.missing[w] == 0:
                self._on_push(w, now)
        return True

    def _on_push(self, w: int, t: float) -> None:
        head, grad = self.push_headers[w], self.grads[w]
        iteration, version_used = int(head[PUSH.iteration]), int(head[PUSH.version])
        if iteration != self.pushes[w]:
            raise ProtocolError(f"push from rank {w + 1}: iteration {iteration}, expected {self.pushes[w]}")
        version_before = self.version
        rejected = bool(self.bad[w])
        if rejected:
            self.rejected += 1
            log.warning("rejected push %d of rank %d: NaN or Inf in the gradient", iteration, w + 1)
        elif self.policy.round_based:
            self.round_members.append(w)
        else:
            for a in self.sfb:  # its factors, as the gradient they stand for (Project Adam's factor push)
                rows = self.factors.rows(w)
                rebuild_gradient(self.factors.V[a.name][rows], self.factors.U[a.name][rows],
                                 grad[a.params].reshape(a.d_in, a.d_out))
            self.opt.step(self.params, grad, self.lr_at(self.version))
            self.version += 1
        self.pushes[w] += 1
        for name in TOTALS:
            self.totals[name][w] += head[getattr(PUSH, name)]
        self.last_loss[w] = head[PUSH.loss]
        self.pull_requested[w] = t
        self.trace.append("pushes", worker=w, iteration=iteration, t=t, version_before=version_before,
                          staleness=version_before - version_used, rejected=rejected)
        if self.fault is not None and self.fault.due(int(self.pushes.sum())):
            self.fault.fire(f"push {int(self.pushes.sum())}")
        self._decide(self.policy.on_push(w, t), t)
        if self._limit_reached(w) and w not in self.left:
            # its last push: tell it to stop now rather than after the policy would release it
            self._retire(w, t)

    def _decide(self, decision, t: float) -> None:
        """Carry out a decision: apply a completed round, answer released pulls, retire finished workers.

        Retiring a worker (``on_leave``) can release others it was holding, so this loops until no
        decision is left to carry out.
        """
        pending = [decision]
        while pending:
            decision = pending.pop()
            self._write_policy_records()
            released = [(w, self._must_stop(w, t)) for w in decision.release if w not in self.left]
            if decision.apply_round:
                self._apply_round(released, t)
            elif released:
                buffer = self._reply_buffer()
                for w, stop in released:
                    self._reply(w, buffer, stop, t)
            for w, stop in released:
                if stop:
                    self.left.add(w)
                    pending.append(self.policy.on_leave(w, t))
        self._write_policy_records()

    def _must_stop(self, w: int, t: float) -> bool:
        return self._limit_reached(w) or self.stopping or bool(self.job.stop.seconds and t >= self.job.stop.seconds)

    def _retire(self, w: int, t: float) -> None:
        """Send `w` its stop reply and let the policy forget it (which may release others)."""
        self._reply(w, self._reply_buffer(), True, t)
        self.left.add(w)
        self._decide(self.policy.on_leave(w, t), t)

    def _apply_round(self, released: list[tuple[int, bool]], t: float) -> None:
        """BSP: the mean of the round's gradients, summed in worker order, as one optimizer step; and
        the replies to the `released` ``(worker, stop)`` pulls.

        The step runs chunk by chunk, and each chunk of the new weights is sent as soon as it is
        updated: a worker copies chunk k (MPI's receiver does the copy) while the server updates
        chunk k+1. Per element the arithmetic is that of one step over the whole buffer.
        """
        members = sorted(self.round_members)
        self.round_members.clear()
        self._settle_replies()
        lr = self.lr_at(self.version)
        if members:  # else every push of the round was rejected, and the weights stay as they are
            self.version += 1
            self._step_sfb_layers(members, lr)
        self.round_mask[:] = 0.0
        self.round_mask[members] = 1.0  # the workers rebuild the SFB layers' mean from these workers
        replies = [self._reply(w, self.params, stop, t, send_weights=False) for w, stop in released]
        sfb = {a.name for a in self.sfb}
        for c, tensor in zip(self.chunks, self.chunk_tensor, strict=True):
            if tensor in sfb:  # stepped whole above, and not sent: every worker steps it the same way
                continue
            if members:
                self.opt.step(self.params[c.start:c.stop], self._round_mean(members, c), lr, offset=c.start)
            for r in replies:
                r.requests.append(self.ctx.comm.Isend([self.params[c.start:c.stop], MPI.FLOAT], r.worker + 1, c.tag))
                self.bytes.sent(tensor, PS, c.size * self.params.itemsize)
        if t >= self.next_checkpoint:  # between rounds is the one consistent point of BSP
            self._checkpoint(t)

    def _step_sfb_layers(self, members: list[int], lr: float) -> None:
        """BSP with SFB: each SFB layer's round mean, rebuilt from the members' factors in worker order
        (one GEMM), as one optimizer step, exactly as every worker does it."""
        for a in self.sfb:
            V, U = self.factors.of(a, members)
            rebuild_gradient(V, U, self.mean_buf[a.params].reshape(a.d_in, a.d_out), scale=1.0 / len(members))
            self.opt.step(self.params[a.params], self.mean_buf[a.params], lr, offset=a.offset)

    def _round_mean(self, members: list[int], c) -> np.ndarray:
        """Chunk `c` of the mean of the members' gradients, summed in worker order (as the oracle)."""
        return round_mean([self.grads[w][c.start:c.stop] for w in members], self.mean_buf[c.start:c.stop])

    def _limit_reached(self, w: int) -> bool:
        """`w` has pushed its last iteration (``stop.iterations`` / ``stop.epochs``)."""
        return self.limits[w] is not None and self.pushes[w] >= self.limits[w]

    # -- pull replies ---------------------------------------------------------------------------

    def _reply_buffer(self) -> np.ndarray:
        """The buffer pull replies are sent from.

        Under a round-based policy (BSP) the parameters change only when a round completes, that is
        when every worker in it has received its previous reply and pushed again; the replies then go
        out from the parameters themselves, and :meth:`_settle_replies` completes any still sending
        before the round is applied. Otherwise a push may be applied while replies are in flight, and
        they go out from a snapshot.
        """
        return self.params if self.policy.round_based else self._snapshot()

    def _settle_replies(self) -> None:
        """Complete every reply still sending from the parameters, before they change (MPI forbids
        changing a buffer whose send has not completed; its receiver has the data already, or is
        polling for it)."""
        backoff = self.ctx.backoff()
        next_watch = self.ctx.now() + HOUSEKEEPING_S
        while any(r.snapshot is self.params for r in self.replies):
            if self._complete_replies():
                backoff.reset()
                continue
            if self.ctx.now() >= next_watch:  # a worker that died before taking its reply
                self._watchdog(self.ctx.now())
                next_watch = self.ctx.now() + HOUSEKEEPING_S
            backoff.idle()

    def _snapshot(self) -> np.ndarray:
        """A copy of the parameters that stays unchanged while sends of it are in flight."""
        buf = self.free_snapshots.pop() if self.free_snapshots else np.empty_like(self.params)
        np.copyto(buf, self.params)
        return buf

    def _reply(self, w: int, snapshot: np.ndarray, stop: bool, t: float,
               send_weights: bool = True) -> _PendingReply:
        """Answer `w`'s pull: post the receives of its next push, send the header and (unless the caller
        sends them itself, chunk by chunk) the weights from `snapshot`."""
        if not stop:
            # post the receives of w's next push before w can send it
            self.missing[w] = self.parts
            self.bad[w] = False
            MPI.Prequest.Startall(self.recvs[w * self.parts:(w + 1) * self.parts])
        head = np.zeros(self.reply_len)
        pack(head[:len(PULL_FIELDS)], PULL_FIELDS, version=self.version, stop=1.0 if stop else 0.0,
             flush=float(self.flush_asked[w]))
        if self.sfb_bsp:
            head[len(PULL_FIELDS):] = self.round_mask
        self.flush_asked[w] = False
        comm = self.ctx.comm
        requests = [comm.Isend([head, MPI.DOUBLE], w + 1, PULL_TAG)]
        if send_weights:  # a worker's first reply holds every tensor; later ones leave out BSP's SFB layers
            chunks = self.reply_chunks if self.pulled[w] else self.chunks
            requests += [comm.Isend([snapshot[c.start:c.stop], MPI.FLOAT], w + 1, c.tag) for c in chunks]
            for c in chunks:
                self.bytes.sent(self.chunk_tensor[c.tag - CHUNK_TAG0], PS, c.size * snapshot.itemsize)
        self.pulled[w] = True
        reply = _PendingReply(w, requests, snapshot, head, t)
        self.replies.append(reply)
        self.last_heard[w] = t
        self.last_told[w] = t
        self.trace.append("pulls", worker=w, t_request=self.pull_requested[w], t_reply=t, version=self.version)
        return reply

    def _complete_replies(self) -> bool:
        finished = [r for r in self.replies if MPI.Request.Testall(r.requests)]
        if not finished:
            return False
        self.replies = [r for r in self.replies if r not in finished]
        # one snapshot serves every pull a decision released; reuse it once none of them is in flight
        done = {id(r.snapshot): r.snapshot for r in finished if r.snapshot is not self.params}
        in_flight = {id(r.snapshot) for r in self.replies}
        self.free_snapshots += [s for key, s in done.items() if key not in in_flight]
        return True

    # -- evaluation, watchdog, trace ------------------------------------------------------------

    def _eval_slice(self) -> None:
        result = self.evaluator.step()
        if result is None:
            return
        t, version, loss, acc, seconds = result
        self._record_eval(t, version, loss, acc, seconds)
        self.last_eval = (loss, acc)

    def _record_eval(self, t: float, version: int, loss: float, acc: float, seconds: float) -> None:
        self.trace.append("evals", t=t, version=version, test_loss=loss, test_acc=acc, seconds=seconds)
        self.evals.append((t, version, loss, acc))
        self.targets.observe(t, acc)

    def _housekeeping(self, now: float) -> None:
        self._watchdog(now)
        self._keep_alive(now)
        if terminate_requested() and not self.stopping:
            log.warning("SIGTERM: the run stops at each worker's next pull, after a checkpoint")
            self.stopping = True
        if now >= self.next_checkpoint and not self.policy.round_based:  # BSP's wait for the round's end
            self._checkpoint(now)
        self._take_other_messages()
        self.trace.maybe_flush()
        heard = self.last_loss[~np.isnan(self.last_loss)]
        self.progress.update(int(self.pushes.sum()), loss=float(heard.mean()) if heard.size else None,
                             test_acc=self.last_eval[1], version=self.version)

    def _watchdog(self, now: float) -> None:
        """Name a worker that owes us a message and has been silent longer than the stall timeout."""
        timeout = self.job.runtime.stall_timeout_s
        waiting_on = [r.worker for r in self.replies]
        for w in range(self.n):
            owes = w in waiting_on or (w not in self.left and w not in self.policy.held)
            if owes and now - self.last_heard[w] > timeout:
                raise StallError(f"worker rank {w + 1} silent for {now - self.last_heard[w]:.1f} s "
                                 f"(runtime.stall_timeout_s = {timeout}); it may have died or hung")

    def _keep_alive(self, now: float) -> None:
        """Tell each worker whose pull the sync model holds, every quarter of the stall timeout, that the
        server still lives: the worker's own watchdog then fires only on a dead or stopped server, not
        on a long hold (``protocol.ALIVE_TAG``)."""
        interval = self.job.runtime.stall_timeout_s / 4
        for w in self.policy.held:
            if w not in self.left and now - self.last_told[w] >= interval:
                self.alive_sends.append(self.ctx.comm.Isend([_ALIVE, MPI.DOUBLE], w + 1, ALIVE_TAG))
                self.last_told[w] = now
        self.alive_sends = [r for r in self.alive_sends if not r.Test()]

    def _take_other_messages(self) -> bool:
        """Take the statistics of workers that have stopped; anything else unmatched is a protocol error
        (every push and header has a receive posted). True when a message was taken."""
        comm, status, took = self.ctx.comm, MPI.Status(), False
        while comm.Iprobe(MPI.ANY_SOURCE, MPI.ANY_TAG, status):
            w = status.Get_source() - 1
            if status.Get_tag() != STATS_TAG or w not in self.left or self.stats[w] is not None:
                raise ProtocolError(f"unexpected message from rank {status.Get_source()} with tag "
                                    f"{status.Get_tag()} ({status.Get_count(MPI.BYTE)} bytes)")
            self.stats[w] = comm.recv(source=w + 1, tag=STATS_TAG)
            took = True
        return took

    def _collect_stats(self) -> list[dict]:
        """Every worker's statistics, waiting for those not taken yet by polling, as the run does: a
        worker that dies or hangs after its last push ends the job (the launcher's notice, or the
        stall timeout) instead of hanging it in a blocking gather."""
        backoff, since = self.ctx.backoff(), self.ctx.now()
        timeout = self.job.runtime.stall_timeout_s
        while None in self.stats:
            if self._take_other_messages():
                backoff.reset()
                continue
            if self.ctx.now() - since > timeout:
                w = self.stats.index(None)
                raise StallError(f"worker rank {w + 1} sent no statistics within {timeout} s after the run "
                                 f"ended (runtime.stall_timeout_s); it may have died or hung")
            backoff.idle()
        return self.stats

    def _write_policy_records(self) -> None:
        for record in self.policy.take_records():
            self.trace.append(record.table, **record.row)

    # -- checkpoints ----------------------------------------------------------------------------

    def _checkpoint(self, t: float) -> None:
        """Write the run's state at run time `t` (``checkpoint.h5``; see ``ebsp_mpi.checkpoint``)."""
        c0 = self.ctx.now()
        write_checkpoint(self.run_dir, Checkpoint(
            params=self.params, velocity=self.opt.velocity, version=self.version, run_seconds=t,
            iterations=self.pushes, totals={**self.totals, LAST_LOSS: self.last_loss}, rejected=self.rejected,
            policy=self.policy.state_dict(),
            evals=self.evals, reached=self.targets.reached, config=to_dict(self.job)))
        log.info("checkpoint at %.1f s: version %d, %d pushes, written in %.2f s", t, self.version,
                 int(self.pushes.sum()), self.ctx.now() - c0)
        every = self.job.checkpoint.every_seconds
        self.next_checkpoint = t + every if every else np.inf
        self.trace.flush()  # a resumed run keeps the trace rows flushed before its checkpoint
        self.flush_asked[:] = True

    def _restore(self, ckpt: Checkpoint) -> None:
        """Continue from `ckpt`: the weights, optimizer state, counts, policy state and evaluations; the
        trace loses what happened after the checkpoint (that work is done again)."""
        if ckpt.params.shape != self.params.shape or len(ckpt.iterations) != self.n:
            raise UsageError(f"checkpoint of {ckpt.params.size} parameters and {len(ckpt.iterations)} workers; "
                             f"this job has {self.params.size} and {self.n}")
        self.params[...] = ckpt.params
        self.opt.velocity[...] = ckpt.velocity
        self.version, self.rejected = ckpt.version, ckpt.rejected
        self.pushes[...] = ckpt.iterations
        for name in TOTALS:
            self.totals[name][...] = ckpt.totals[name]
            self.resumed_totals[name][...] = ckpt.totals[name]
        self.last_loss[...] = ckpt.totals[LAST_LOSS]
        self.policy.load_state_dict(ckpt.policy)
        self.evals = [tuple(e) for e in ckpt.evals]
        self.targets.reached.update(ckpt.reached)
        T = ckpt.run_seconds
        for table, column in (("pushes", "t"), ("pulls", "t_reply"), ("evals", "t"), ("zipline", "t")):
            self.trace.truncate(table, column, T)
        kept = self.trace.truncate("barriers", "t_released", T)
        self.trace.truncate("barrier_members", "barrier", kept - 1)
        self.trace.set_attrs(resumed_at_s=T)
        log.info("resumed from the checkpoint at %.1f s: version %d, iterations %s", T, self.version,
                 self.pushes.tolist())

    def _whole_run(self, stats: list[dict], key: str, total: str) -> list[float]:
        """Per worker, `key` of its statistics plus what the run had done before a resume."""
        return [s[key] + float(self.resumed_totals[total][w]) for w, s in enumerate(stats)]

    # -- the end --------------------------------------------------------------------------------

    def _finish(self) -> dict:
        wall = self.ctx.now()
        loss, acc = self.evaluator.evaluate_now(self.params)
        self._record_eval(wall, self.version, loss, acc, self.ctx.now() - wall)
        if self.fault is not None and self.fault.due("end"):
            self.fault.fire("the end")
        # the trained model and the server's trace do not depend on the workers' statistics: keep them
        # even if a worker fails to report
        write_model(self.run_dir, self.space.state_dict(), version=self.version, step=self.version,
                    attrs={"sync": self.policy.name, "config_json": to_dict(self.job)})
        self.trace.flush()
        self._checkpoint(wall)  # the end, from which a longer run (a larger stop.*) can go on
        stats = self._collect_stats()
        wait_all(self.alive_sends, self.ctx.backoff())  # small sends, complete already or soon
        self.progress.close(int(self.pushes.sum()), test_acc=acc, version=self.version)
        heard = self.last_loss[np.isfinite(self.last_loss)]
        summary = build_summary(
            self.job, sync=self.policy.name, world_size=self.ctx.size,
            backend=stats[0]["backend"] if stats else "numpy", wall_seconds=wall, iterations=self.pushes.tolist(),
            wait_seconds=self._whole_run(stats, "wait_seconds", "wait_s"),
            compute_seconds=self._whole_run(stats, "compute_seconds", "compute_s"),
            injected_delay_seconds=self._whole_run(stats, "injected_delay_seconds", "injected_delay_s"),
            barriers=self.policy.barriers,
            rejected_pushes=self.rejected, versions=self.version,
            train_loss=float(heard.mean()) if heard.size else None, test_loss=loss, test_accuracy=acc,
            targets=self.targets, evals=self.evals, mpi_library=mpi_library(), hybrid=self.hybrid_plan,
            byte_counts=[self.bytes.as_dict()] + [s["bytes"] for s in stats])
        write_summary(self.run_dir, summary)
        self.trace.set_attrs(rejected_pushes=self.rejected, hybrid=self.hybrid_plan, bytes=self.bytes.as_dict())
        self.trace.close()
        return summary
