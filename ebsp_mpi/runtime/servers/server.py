"""Rank 0: the parameter server and the sync scheduler.

It owns the global parameters and the optimizer state (with ``runtime.servers = k > 1``, those of its
shard, the others' on ranks 1..k-1) and keeps a receive posted for every part of every worker's next
push that comes to it. Once a push is complete it asks the coordinator (``sync.coordinator``) what to
do and carries the actions out: apply the push, close a BSP round, answer pulls, stop a worker. It
decides nothing itself. Replies go out from buffers that never change while a send of them is in
flight (docs/design.md, "Parameters on the wire"): snapshots of the parameters, or under BSP the
parameters themselves, which only a completed round changes, after every reply still sending from
them has completed (``runtime.servers.shard``).

The coordinator's decisions on an event come as one list of typed orders (``runtime.servers.orders``), which
rank 0 carries out on its shard through the order executor every server rank shares
(``runtime.servers.executor``) and, with k servers, sends to the others, which carry them out on theirs: every
shard applies the same pushes in the same order and every reply, evaluation and checkpoint holds
exactly the pushes rank 0 decided on (docs/design.md, "Sharded servers"; the release rule holds with
equality). What only rank 0 adds to an order (a reply's header, the trace) is its part as the
executor's :class:`~ebsp_mpi.runtime.servers.executor.Host`.

The message loop polls (``Testsome``) instead of blocking, so that between messages it can evaluate the
model one slice at a time, watch for stalled ranks, flush the trace and report progress. What it
records (evaluations, checkpoints, the workers' totals, progress, the summary) is its ``Recorder``'s
(``runtime.recorder``); OSDP's fetches are answered by a ``FetchServer`` (``runtime.fetch``).
"""

from __future__ import annotations

import logging

import numpy as np
from mpi4py import MPI

from ...checkpoint import Checkpoint
from ...errors import UsageError
from ...sync.coordinator import Coordinator
from ...sync.registry import make_policy
from .executor import OrderExecutor
from .host import SchedulerHost
from .orders import OrderList, RoundOrder
from .probe import NO_PROBE, ServerProbe
from ..rank.faults import fault_for
from ..rank.signals import stop_signals, terminate_requested
from ..rank.trace_file import open_rank_trace
from .peers import PeerServers
from .recorder import Recorder
from .shard import ShardStore
from ..transport.context import Context
from ..transport.failures import StallError
from ..transport.fetch import FetchServer
from ..transport.keepalive import HOUSEKEEPING_S
from ..transport.layout import worker_limits
from ..transport.protocol import ALIVE_TAG, PUSH, STATS_TAG, ProtocolError

log = logging.getLogger(__name__)


class Server:
    """Serve one training run; :meth:`run` returns the summary (also written to ``summary.json``)."""

    def __init__(self, ctx: Context, description, run_dir, show_progress: bool = True,
                 resume: Checkpoint | None = None, probe: ServerProbe = NO_PROBE):
        job = description.job
        self.ctx, self.job, self.run_dir, self.description = ctx, job, run_dir, description
        n = self.n = ctx.workers
        model = description.model()  # the server's copy: parameters, layout, init from the seed
        self.space = model.space
        self.params = model.space.data
        self.policy = make_policy(job.sync, n, seed=job.seed)
        self.layout = description.layout
        self.store = ShardStore(ctx, job, self.params, self.layout, 0, self.policy.round_based,
                                resume.version if resume is not None else 0)
        self.opt = self.store.opt
        self.peers = PeerServers(ctx, self.layout, job.runtime.stall_timeout_s)
        # OSDP: the workers fetch their on-demand layers from the servers that hold them
        self.fetches = (FetchServer(ctx, self.layout, self.params, self.store.bytes, self.store.stream)
                        if self.layout.schedule else None)
        # evaluation, checkpoints and model.h5 read the whole model: with several servers, gathered
        self.whole = self.params if ctx.servers == 1 else np.empty_like(self.params)
        self.whole_velocity = self.opt.velocity if ctx.servers == 1 else np.empty_like(self.opt.velocity)
        self.limits = worker_limits(description.limits, self.layout)
        self.coordinator = Coordinator(self.policy, self.limits, job.stop.seconds)
        self._log_layout()
        self.stats: list[dict | None] = [None] * n  # what each worker reports once it has stopped
        self.unflushed = np.zeros(n, dtype=bool)  # whose trace may lack rows the pending checkpoint counts
        self.trace = open_rank_trace(ctx, job, run_dir, role="server", backend="numpy", device="cpu",
                                     append=resume is not None)
        self.trace.set_attrs(**self.layout.as_attrs())
        # rank 0's part of each order: reply headers, the pull trace, the workers' watch times
        self.host = SchedulerHost(ctx, self.trace, self.layout.sfb_bsp, job.runtime.stall_timeout_s)
        self.probe = probe  # a benchmark's watch on the loop and the rounds (runtime.servers.probe)
        self.executor = OrderExecutor(self.store, host=self.host, on_idle=self._while_waiting, probe=probe)
        self.fault = fault_for(0, ctx.size)  # EBSP_INJECT_FAULT, to test the failure paths
        if resume is not None:
            self._restore(resume)
        self.recorder = Recorder(ctx, description, run_dir, self.trace, self.limits, show_progress, resume)

    def _log_layout(self) -> None:
        if self.layout.sfb:
            log.info("comm.hybrid = %s: sufficient factors for %s", self.job.comm.hybrid,
                     ", ".join(a.name for a in self.layout.sfb))
        if self.ctx.servers > 1:
            log.info("runtime.servers = %d: %s", self.ctx.servers, self.layout.describe())

    # -- the run --------------------------------------------------------------------------------

    def run(self) -> dict:
        backoff = self.ctx.backoff()
        messages = len(self.layout.chunks)
        log.info("server: %s with %d workers, %d parameters in %d message%s per push, %s", self.policy.name, self.n,
                 self.space.size, messages, "" if messages == 1 else "s", stop_text(self.limits, self.job.stop.seconds))
        if self.description.plan is not None and self.ctx.any_oversubscribed:
            log.warning("osdp: ranks share cores: the plan's predicted iteration time assumes a core per rank "
                        "(docs/osdp.md)")
        self.trace.set_attrs(clock_offset_s=0.0)
        t = self.ctx.now()
        self.host.start(t)
        self.peers.start(t)
        self.recorder.record.start(t)  # a resumed run's clock goes on from its checkpoint
        self._start_workers(t)
        next_housekeeping = 0.0
        while not self.coordinator.finished or self.store.replies:
            self.probe.serving()
            progressed = self._serve_pushes()
            self.probe.served(progressed)
            if self.fetches is not None:
                progressed |= self.fetches.take(self.host.last_heard, self.ctx.now())
            now = self.ctx.now()
            self.peers.flush(now)
            progressed |= self.store.complete_replies()
            progressed |= self.recorder.evaluate_slice()
            if now >= next_housekeeping:
                self._housekeeping(now)
                next_housekeeping = now + HOUSEKEEPING_S
            if not self.store.round_open:  # a streaming round's chunks are part new, part old
                self.recorder.maybe_start_eval(now, self.coordinator.version, self._whole_model)
            if progressed:
                backoff.reset()
            else:
                backoff.idle()
        return self._finish()

    def _start_workers(self, t: float) -> None:
        """Every worker pulls the initial weights (the coordinator's start, at run time `t`)."""
        decided = OrderList(self.coordinator)
        self.coordinator.start_to(decided, t)
        self._carry_out(decided, t)

    def _serve_pushes(self) -> bool:
        """Take the parts of pushes that have come and act on the pushes they complete; True when any
        part came (``shard.Arrivals``)."""
        arrived = self.store.take_parts(self.host.last_heard, self.ctx.now())
        # a push's time is read after the test that found it complete: read before, it could precede the
        # worker's own time of sending by as long as the tests took (0.45 ms seen across nodes)
        now = self.ctx.now()
        if arrived.complete:
            self.executor.arrived(arrived.complete)
        for w in arrived.complete:
            self._on_push(w, now)
        streamed = self.executor.stream(self.ctx.backoff())
        return arrived.parts > 0 or streamed

    def _on_push(self, w: int, t: float) -> None:
        """`w`'s push is complete here: trace it, and carry out what the coordinator decides."""
        coordinator, head = self.coordinator, self.store.headers[w]
        iteration, version_used = coordinator.pushes[w], int(head[PUSH.version])
        version_before = coordinator.version
        # NaN or Inf in the gradient (the worker's check), or with one server in the delay-compensated step
        rejected = self.store.rejected(w, iteration) or \
            (self.ctx.servers == 1 and not self.store.corrected_step_finite(w))
        self.recorder.pushed(w, head)
        self.host.pull_requested[w] = t
        self.trace.append("pushes", worker=w, iteration=iteration, t=t, version_before=version_before,
                          staleness=version_before - version_used, rejected=rejected)
        if not rejected:
            self.recorder.record.divergence.push(version_before - version_used)
        if head[PUSH.flushed]:  # its trace holds every iteration the pending checkpoint counts
            self._flushed(w)
        decided = OrderList(coordinator)
        coordinator.push_to(decided, w, t, rejected)
        if self.fault is not None and self.fault.due(pushed := sum(coordinator.pushes)):
            self.fault.fire(f"push {pushed}")
        self._carry_out(decided, t)

    def _carry_out(self, decided: OrderList, t: float) -> None:
        """Carry out the coordinator's decision at run time `t`: its trace rows, then its orders, on rank
        0's shard and, through the order stream, on the other servers'. Rank 0 decided on pushes it
        holds whole, so none of its orders waits. Between rounds is BSP's one consistent point for a
        checkpoint."""
        for record in decided.records:
            self.trace.append(record.table, **record.row)
        for order in decided.orders:
            self.peers.order(order)
        self.host.t_event = t
        self.executor.take(decided.orders)
        self.executor.carry_out()
        if self.executor.queue:
            raise ProtocolError(f"rank 0 could not carry out its own order {self.executor.queue[0]}")
        if any(type(order) is RoundOrder for order in decided.orders) and self._checkpoint_due(t):
            self._checkpoint(t)

    def _whole_model(self, velocity: bool = False) -> np.ndarray:
        """The parameters as of now (with `velocity`, the optimizer state too, in ``whole_velocity``):
        with several servers, every shard gathered at the same point of the order stream."""
        if self.ctx.servers > 1:
            self.peers.gather(self.params, self.opt.velocity, self.whole,
                              self.whole_velocity if velocity else None, self.ctx.backoff(), self._while_waiting)
        return self.whole

    # -- watchdog, keep-alives, other messages -------------------------------------------------

    def _housekeeping(self, now: float) -> None:
        self._watchdog(now)
        self._keep_alive(now)
        self.peers.housekeeping(now)
        if terminate_requested() and not self.coordinator.stopping:
            log.warning("%s: the run stops at each worker's next pull, after a checkpoint", stop_signals.name)
            self.coordinator.request_stop()
        if self._checkpoint_due(now) and not self.policy.round_based:  # BSP's: at a round's end
            self._checkpoint(now)
        self._take_other_messages()
        self.trace.maybe_flush()
        self.recorder.show_progress(self.coordinator)

    def _while_waiting(self) -> None:
        """While the server waits for its own replies to complete or for the other servers' shards: the
        watchdogs, and the keep-alives to the workers it holds, which would otherwise take a long gather
        (another server's node lost) for the silence of rank 0 and name it, alive, as silent."""
        now = self.ctx.now()
        self._watchdog(now)
        self._keep_alive(now)
        self.peers.housekeeping(now)

    def _watchdog(self, now: float) -> None:
        """Name a worker that owes us a message and has been silent longer than the stall timeout."""
        timeout = self.job.runtime.stall_timeout_s
        waiting_on, coordinator, last_heard = self.store.replying_to(), self.coordinator, self.host.last_heard
        for w in range(self.n):
            owes = w in waiting_on or coordinator.owes_push(w)
            if owes and now - last_heard[w] > timeout:
                raise StallError(f"worker rank {self.ctx.worker_rank(w)} silent for {now - last_heard[w]:.1f} s "
                                 f"(runtime.stall_timeout_s = {timeout}); it may have died or hung",
                                 [self.ctx.worker_rank(w)])

    def _keep_alive(self, now: float) -> None:
        """Tell each worker whose pull the sync model holds, and each that has stopped, every quarter of
        the stall timeout, that the server still lives: the worker's own watchdog then fires only on a
        dead or stopped server, not on a long hold, nor on a wait for slower workers to finish (a
        worker that stopped more than the stall timeout before the last one named the server, alive)
        (``protocol.ALIVE_TAG``)."""
        owes = self.coordinator.owes_push
        self.host.alive.tick(now, [self.ctx.worker_rank(w) for w in range(self.n) if not owes(w)])

    def _take_other_messages(self) -> bool:
        """Take the statistics of workers that have stopped, and the other servers' keep-alives and
        statistics; anything else unmatched is a protocol error (every header has a receive posted, and
        every chunk of a push but those a streamed round posts in turn). True when a message was taken."""
        comm, status, took = self.ctx.comm, MPI.Status(), False
        while True:
            if not (comm.Iprobe(MPI.ANY_SOURCE, STATS_TAG, status) or comm.Iprobe(MPI.ANY_SOURCE, ALIVE_TAG, status)):
                # anything else unmatched is a protocol error, but a chunk of a push whose receive is
                # posted in its turn (a streamed round's pace, ``ShardStore.expect_push``)
                if comm.Iprobe(MPI.ANY_SOURCE, MPI.ANY_TAG, status) and status.Get_tag() not in (STATS_TAG, ALIVE_TAG) \
                        and not self.store.paced(status.Get_source(), status.Get_tag()):
                    raise unexpected_message(status)
                break
            took = True
            if self.peers.take(status, self.ctx.now()):
                continue
            w = self.ctx.worker_of(status.Get_source())
            if status.Get_tag() != STATS_TAG or w not in self.coordinator.left or self.stats[w] is not None:
                raise unexpected_message(status)
            self.stats[w] = comm.recv(source=status.Get_source(), tag=STATS_TAG)
            self._flushed(w)  # a worker reports once it has closed its trace
        return took

    def _collect_stats(self) -> list[dict]:
        """Every worker's and server's statistics, waiting for those not taken yet by polling, as the
        run does: a rank that dies or hangs after its last push ends the job (the launcher's notice,
        or the stall timeout) instead of hanging it in a blocking gather."""
        backoff, since = self.ctx.backoff(), self.ctx.now()
        timeout = self.job.runtime.stall_timeout_s
        while None in self.stats or None in self.peers.stats.values():
            self._keep_alive(self.ctx.now())
            if self._take_other_messages():
                backoff.reset()
                continue
            if self.ctx.now() - since > timeout:
                missing = [r for r, s in self.peers.stats.items() if s is None] + \
                    [self.ctx.worker_rank(w) for w, s in enumerate(self.stats) if s is None]
                kind = "server" if missing[0] < self.ctx.servers else "worker"
                raise StallError(f"{kind} rank {missing[0]} sent no statistics within {timeout} s after the run "
                                 f"ended (runtime.stall_timeout_s); it may have died or hung", missing)
            backoff.idle()
        return self.stats

    # -- checkpoints ----------------------------------------------------------------------------

    def _checkpoint_due(self, t: float) -> bool:
        """A checkpoint is due at `t`, and the last one is committed."""
        return self.recorder.pending is None and self.recorder.record.checkpoint_due(t)

    def _checkpoint(self, t: float, whole: tuple[np.ndarray, np.ndarray] | None = None) -> None:
        """Write the run's state at run time `t` as the pending checkpoint: the parameters and optimizer
        state `whole` already gathered as of now, or gathered here. It is committed (becomes the one a
        resume reads) once every worker's trace holds the iterations it counts: each flushes at its next
        reply and says so in its next push, or has closed its trace and reported (:meth:`_flushed`). A
        kill before then resumes from the previous checkpoint, so no worker's trace lacks rows of work
        a checkpoint counts."""
        params, velocity = whole if whole is not None else (self._whole_model(velocity=True), self.whole_velocity)
        self.recorder.checkpoint(t, params, velocity, self.coordinator, self.policy)
        self.host.flush_asked[:] = True  # the workers flush theirs at their next reply
        self.unflushed[:] = [s is None for s in self.stats]
        self._flushed(None)

    def _flushed(self, w: int | None) -> None:
        """Worker `w` has flushed its trace since the pending checkpoint was written: commit it when
        every worker has."""
        if w is not None:
            self.unflushed[w] = False
        if self.recorder.pending is not None and not self.unflushed.any():
            self.recorder.commit_checkpoint()

    def _restore(self, ckpt: Checkpoint) -> None:
        """Continue from `ckpt`: the weights, optimizer state, counts and policy state (the recorder
        takes its totals and evaluations); the trace loses what happened after the checkpoint (that
        work is done again)."""
        if ckpt.params.shape != self.params.shape or len(ckpt.iterations) != self.n:
            raise UsageError(f"checkpoint of {ckpt.params.size} parameters and {len(ckpt.iterations)} workers; "
                             f"this job has {self.params.size} and {self.n}")
        self.params[...] = ckpt.params
        self.opt.velocity[...] = ckpt.velocity
        self.coordinator.restore(ckpt.version, ckpt.iterations, ckpt.rejected, ckpt.policy)
        T = ckpt.run_seconds
        for table, column in (("pushes", "t"), ("pulls", "t_reply"), ("evals", "t"), ("zipline", "t")):
            self.trace.truncate(table, column, T)
        kept = self.trace.truncate("barriers", "t_released", T)
        self.trace.truncate("barrier_members", "barrier", kept - 1)
        self.trace.set_attrs(resumed_at_s=T)
        log.info("resumed from the checkpoint at %.1f s: version %d, iterations %s", T, ckpt.version,
                 list(self.coordinator.pushes))

    # -- the end --------------------------------------------------------------------------------

    def _osdp(self, stats: list[dict]) -> dict | None:
        """With an OSDP plan: its prediction beside what each worker measured (``runtime.peak``)."""
        plan = self.description.plan
        if plan is None:
            return None
        return {"plan": plan.path, "ranks_share_cores": self.ctx.any_oversubscribed, "predicted": plan.predicted,
                "measured": {key: [s["osdp"][key] for s in stats]
                             for key in ("peak_bytes", "live_peak_bytes", "iteration_s", "transfer_wait_s",
                                     "transfer_messages")}}

    def _finish(self) -> dict:
        wall, version = self.ctx.now(), self.coordinator.version
        # gathered once, with the optimizer state, for the evaluation, model.h5 and the last checkpoint
        whole = self._whole_model(velocity=True)
        if whole is not self.params:  # no reply sends from the parameters any more: take every shard in
            np.copyto(self.params, whole)
        self.recorder.evaluate_now(self.params, wall, version)
        if self.fault is not None and self.fault.due("end"):
            self.fault.fire("the end")
        # the trained model and the server's trace do not depend on the workers' statistics: keep them
        # even if a worker fails to report
        self.recorder.record.write_model(self.space.state_dict(), version, self.policy.name)
        self.trace.flush()
        # the end, from which a longer run can go on: committed as each worker's statistics come in
        self._checkpoint(wall, (whole, self.whole_velocity))
        self.peers.end(self.ctx.now())
        if self.fetches is not None:  # every worker has had its stop reply: no fetch is coming
            self.fetches.close()
        stats = self._collect_stats()
        self.host.alive.part([self.ctx.worker_rank(w) for w in range(self.n)])
        self.host.alive.wait(self.ctx.backoff())
        self.peers.wait_sends(self.ctx.backoff())
        summary = self.recorder.summary(
            wall, self.coordinator, self.policy, stats, hybrid=self.layout.hybrid_plan,
            byte_counts=[self.store.bytes.as_dict()] + [self.peers.stats[r]["bytes"] for r in self.peers.ranks]
            + [s["bytes"] for s in stats], osdp=self._osdp(stats))
        self.recorder.record.write_summary(summary)
        self.trace.set_attrs(rejected_pushes=self.coordinator.rejected, hybrid=self.layout.hybrid_plan,
                             bytes=self.store.bytes.as_dict(), redone_rounds=self.store.redone_rounds,
                             pushes_in_place=sorted(self.store.receives.in_place))
        self.trace.close()
        return summary


def stop_text(limits: list[int | None], seconds: float) -> str:
    """When the run stops, for its first line: each worker's iteration limit (None: none) and the time
    limit `seconds` (0: none)."""
    known = [lim for lim in limits if lim is not None]
    parts = []
    if known:
        parts.append(f"{known[0]} iterations per worker" if len(set(limits)) == 1 else f"{limits} iterations")
    if seconds > 0:
        parts.append(f"{seconds:g} s")
    return "stop at " + " or ".join(parts) if parts else "no stop but a signal"


def unexpected_message(status: MPI.Status) -> ProtocolError:
    """The error for a message no receive was posted for: its source, tag and size."""
    return ProtocolError(f"unexpected message from rank {status.Get_source()} with tag {status.Get_tag()} "
                         f"({status.Get_count(MPI.BYTE)} bytes)")
