"""MPI set-up shared by the server and the workers: the library's communicator, node-local rank,
one time axis for all ranks, polling without burning a core, and aborting the job on failure."""

from __future__ import annotations

import logging
import math
import os
import signal
import socket
import sys
import time
import traceback
from dataclasses import dataclass, field

import numpy as np
from mpi4py import MPI

from .. import __version__
from ..config import to_dict
from ..errors import OutputError, UsageError
from ..safe_text import clean_text
from ..stop_signals import StopSignals
from ..trace.writer import open_trace
from .protocol import ALIVE_TAG, CLOCK_TAG, chunk_bytes_for

log = logging.getLogger(__name__)

#: seconds between printing why the job stops and calling MPI_Abort
ABORT_GRACE_S = 0.5
#: seconds MPI_Abort may take before the rank exits by itself. Under Hydra, MPI_Abort asks the node's
#: proxy over its PMI socket and waits for the launcher: on a node whose link is cut neither answers
#: ever, and the rank would sleep in that read for good (nothing reaps ranks under mpiexec)
ABORT_BOUND_S = 10.0
CLOCK_ROUNDS = 16
#: seconds between a server's housekeeping passes (keep-alives, watchdogs, trace flush; on rank 0 also
#: evaluation start, progress and stray messages)
HOUSEKEEPING_S = 0.05
#: what a keep-alive carries (never written, so always safe to send)
ALIVE = np.zeros(1)
#: what the server's last keep-alive to a worker carries, once every worker's statistics are in: no other
#: follows, and the worker may stop listening (``protocol.ALIVE_TAG``)
PARTING = np.ones(1)


class JobFailure(RuntimeError):
    """An expected way for a run to fail (a stalled worker): reported in one line, no traceback."""


class StallError(JobFailure):
    """A rank that owes this one a message has been silent longer than ``runtime.stall_timeout_s``.

    `ranks` are the silent ranks, where the one that raises knows them: :func:`abort` names the other
    ranks of their nodes too (:func:`node_note`), which a lost node takes with it."""

    def __init__(self, text: str, ranks=()):
        super().__init__(text)
        self.ranks = tuple(int(r) for r in ranks)


class Silence:
    """A deadline on a wait: :meth:`check` raises :class:`StallError` with `what` once no message has
    come for `timeout_s` seconds since :meth:`heard` (or since it was made).

    Parameters
    ----------
    timeout_s : float
        Seconds of silence allowed (``runtime.stall_timeout_s``).
    what : str or callable
        Who is silent, for the message (e.g. ``"the server (rank 0)"``), or a function that says it
        when the deadline passes (e.g. the ranks whose messages a wait still lacks).
    keepalive : MPI.Prequest, optional
        A persistent receive of the peer's keep-alive messages (``protocol.ALIVE_TAG``), started: each
        one that arrives counts as a message, and the receive is posted again.
    ranks : tuple of int or callable
        The silent ranks (or a function that says them), for :class:`StallError`.
    """

    #: a check looks at the clock and the keep-alive at most this often: a waiting rank polls every
    #: 20 - 200 us, and each look costs an MPI call, where the deadline is seconds away
    EVERY_S = 2e-3

    def __init__(self, timeout_s: float, what: str, keepalive=None, ranks=()):
        self.timeout_s, self.what, self.keepalive, self.ranks = timeout_s, what, keepalive, ranks
        self.next_look = 0.0
        self.heard()

    def heard(self) -> None:
        self.since = time.monotonic()

    def check(self) -> None:
        now = time.monotonic()
        if now < self.next_look:
            return
        self.next_look = now + self.EVERY_S
        if self.keepalive is not None and self.keepalive.Test():
            self.keepalive.Start()
            self.heard()
            return
        silent = time.monotonic() - self.since
        if silent > self.timeout_s:
            what = self.what() if callable(self.what) else self.what
            raise StallError(f"{what} sent nothing for {silent:.1f} s (runtime.stall_timeout_s = "
                             f"{self.timeout_s}); it may have died or hung",
                             self.ranks() if callable(self.ranks) else self.ranks)


class Deadline:
    """A fixed deadline on a wait, unlike :class:`Silence` not moved by what arrives (the set-up
    exchange, where each peer sends one message): :meth:`check` raises :class:`StallError` with
    ``say()``'s text and ``ranks()``'s silent ranks once `timeout_s` have passed since it was made."""

    def __init__(self, timeout_s: float, say, ranks=tuple):
        self.end, self.say, self.ranks = time.monotonic() + timeout_s, say, ranks

    def heard(self) -> None:
        pass

    def check(self) -> None:
        if time.monotonic() > self.end:
            raise StallError(self.say(), self.ranks())


@dataclass
class Context:
    """Where this process stands in the job.

    Attributes
    ----------
    comm : MPI.Comm
        A duplicate of ``COMM_WORLD``: the library's traffic never matches a user's messages.
    rank, size : int
        Rank and world size.
    servers : int
        ``runtime.servers`` (k): ranks 0..k-1 are servers (rank 0 also schedules), ranks k..size-1 are
        workers 0..size-k-1. Set from the job once it is read (1 until then).
    local_rank : int
        Rank among the processes on this node (picks the GPU).
    hosts : list of str
        Every rank's host name, by rank (known once the job has started: ``launch._start``); a rank
        that stops on a silent peer names the other ranks of that peer's node (:func:`node_note`).
    clock_offset : float
        Seconds to add to this rank's ``perf_counter`` to read rank 0's (measured at start-up).
    t0 : float
        Rank 0's ``perf_counter`` at the run's start: :meth:`now` counts from it. Set at setup, and
        again by :func:`restart_clock` once every rank has built its part of the job.
    oversubscribed : bool
        More ranks of the job on this node than CPUs they may run on: waiting ranks must sleep
        (see :class:`Backoff`).
    any_oversubscribed : bool
        Some node of the job is oversubscribed (the same on every rank).
    """

    comm: MPI.Comm
    rank: int
    size: int
    local_rank: int
    clock_offset: float = 0.0
    t0: float = 0.0
    oversubscribed: bool = True
    any_oversubscribed: bool = True
    factor_comm: MPI.Comm | None = None  # a second duplicate: sufficient factors (comm.hybrid) travel on it
    fetch_comm: MPI.Comm | None = None  # a third: OSDP's on-demand fetches (protocol.FETCH_TAG) travel on it
    servers: int = 1
    #: the run's identity (``ebsp_mpi.identity.Identity``), the same on every rank: its traces carry it
    identity: object = None
    hosts: list[str] = field(default_factory=list)

    @property
    def workers(self) -> int:
        return self.size - self.servers

    @property
    def is_server(self) -> bool:
        return self.rank < self.servers

    def worker_rank(self, worker: int) -> int:
        """The rank of worker index `worker`."""
        return self.servers + worker

    def worker_of(self, rank: int) -> int:
        """The worker index of `rank` (a worker's rank)."""
        return rank - self.servers

    def role_of(self, rank: int) -> str:
        """``"server"`` (rank 0 with one server), ``"server 1"``, or ``"worker 3"``: for messages."""
        return role_name(rank, self.servers)

    def now(self) -> float:
        """Seconds since the run's start on rank 0's clock (the time axis of every trace)."""
        return time.perf_counter() + self.clock_offset - self.t0

    @property
    def host(self) -> str:
        return socket.gethostname()

    def chunk_bytes(self, configured: int, total_bytes: int = 0) -> int:
        """The largest message of this job's pushes and replies (``runtime.chunk_bytes``; 0: automatic,
        from the model's `total_bytes` too where there are several servers)."""
        return chunk_bytes_for(configured, self.any_oversubscribed, total_bytes, self.servers)

    def backoff(self) -> Backoff:
        """How this rank waits for messages: sleeping only where the node has no core to spare."""
        return Backoff(spin=not self.oversubscribed)


def role_name(rank: int, servers: int) -> str:
    """What `rank` is in a job of `servers` servers, for messages: ``server``, ``server 1``, ``worker 0``."""
    if rank < servers:
        return "server" if servers == 1 else f"server {rank}"
    return f"worker {rank - servers}"


def restart_clock(ctx: Context, silence: Silence | None = None) -> None:
    """Start the run's time axis now, on every rank at once (a collective): the time a run takes to
    reach an accuracy should not count loading data or compiling kernels."""
    t0 = np.array([time.perf_counter() if ctx.rank == 0 else 0.0])
    wait_collective(ctx, ctx.comm.Ibcast(t0, root=0), silence)
    ctx.t0 = float(t0[0])


def wait_collective(ctx: Context, request, silence: Silence | None = None) -> None:
    """Complete a nonblocking collective by polling. Blocked inside MPI, a rank whose peer has died
    would never see the launcher's notice (SIGUSR1 runs its Python handler only between calls) and the
    job would hang; polling lets the handler raise and the job abort. With `silence`, a collective that
    does not complete in time raises :class:`StallError`."""
    wait_all([request], ctx.backoff(), silence)


def setup(base: MPI.Comm | None = None) -> Context:
    """Duplicate the world communicator, find the node-local rank and put all ranks on one clock.

    `base` (default ``COMM_WORLD``) is the group of ranks that form the job; the benchmarks run the
    server with fewer workers than there are ranks by passing a part of the world.
    """
    _survive_peer_failure_notices()
    _note_termination_requests()
    comm = (MPI.COMM_WORLD if base is None else base).Dup()
    local = comm.Split_type(MPI.COMM_TYPE_SHARED)
    ctx = Context(comm=comm, rank=comm.Get_rank(), size=comm.Get_size(), local_rank=local.Get_rank(),
                  factor_comm=comm.Dup(), fetch_comm=comm.Dup())
    ctx.oversubscribed = local.Get_size() > len(set().union(*local.allgather(_cpus())))
    ctx.any_oversubscribed = comm.allreduce(ctx.oversubscribed, op=MPI.LOR)
    local.Free()
    ctx.clock_offset = _measure_clock_offset(comm)
    restart_clock(ctx)
    return ctx


def _cpus() -> set[int]:
    """The CPUs this process may run on (all of the machine's where affinity is unknown)."""
    if hasattr(os, "sched_getaffinity"):
        return set(os.sched_getaffinity(0))
    return set(range(os.cpu_count() or 1))


#: SIGTERM noted here from :func:`setup` on; SIGINT (Ctrl-C) too once a training run takes it
#: (:func:`take_ctrl_c`: a benchmark still dies of it)
stop_signals = StopSignals()


def _note_termination_requests() -> None:
    """Take SIGTERM as a request to stop cleanly rather than die: Slurm sends it to every task before a
    time limit or a preemption (``--signal``). The server then checkpoints and stops the workers at
    their next pull (:func:`terminate_requested`); a worker goes on until the server stops it."""
    stop_signals.install(signal.SIGTERM)


def take_ctrl_c() -> None:
    """Take SIGINT as SIGTERM: a terminal's Ctrl-C sends it to every rank (and MPICH's mpiexec once
    more), and a training run then stops as after SIGTERM, exiting 130 (:mod:`ebsp_mpi.stop_signals`)."""
    stop_signals.install(signal.SIGINT)


def terminate_requested() -> bool:
    """SIGTERM or SIGINT has come to this process."""
    return bool(stop_signals)


class PeerFailure(JobFailure):
    """The launcher reported a dead rank, and this rank found which one."""


#: called (on rank 0) when the launcher signals that a process failed; see :func:`watch_peers`
_peers: list[tuple[str, int]] = []
_servers = [1]  # runtime.servers of the job, to name a dead rank's role


def _survive_peer_failure_notices() -> None:
    """Keep running when the launcher announces that another rank died, and name the dead rank.

    MPICH's Hydra, run with ``-disable-auto-cleanup``, sends SIGUSR1 to the surviving ranks when one
    dies. Python's default action for SIGUSR1 ends the process, so every survivor would vanish without a
    word. Instead rank 0 looks up which rank's process is gone (those on its own node, by PID) and raises
    :class:`PeerFailure` naming it, which aborts the job; for ranks on other nodes the server's watchdog
    names the silent worker after ``runtime.stall_timeout_s``.
    """
    if not hasattr(signal, "SIGUSR1"):
        return

    def notice(signum, frame):
        here = [rank for rank, (host, _) in enumerate(_peers) if host == socket.gethostname()]
        for _ in range(50):  # the notice can come while the dead process is still being torn down
            dead = [rank for rank in here if _process_gone(_peers[rank][1])]
            if dead or not here:
                break
            time.sleep(0.01)
        if dead:
            raise PeerFailure("; ".join(f"rank {r} ({role_name(r, _servers[0])}, pid "
                                        f"{_peers[r][1]} on {_peers[r][0]}) died" for r in dead))
        log.warning("the MPI launcher signalled a failed process (SIGUSR1); the server's watchdog names a "
                    "silent worker after runtime.stall_timeout_s")

    signal.signal(signal.SIGUSR1, notice)


def watch_peers(procs: list[tuple[str, int]], servers: int = 1) -> None:
    """Remember the (host, pid) of the ranks this one watches (rank 0 every rank, the others the
    servers), by rank, to name a dead one when the launcher signals it."""
    _peers[:] = procs
    _servers[0] = servers


def _process_gone(pid: int) -> bool:
    """True when `pid` no longer runs (exited, or a zombie its parent has not reaped yet)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] in ("Z", "X")
    except FileNotFoundError:
        return True
    except OSError:  # no /proc (macOS): signal 0 only tells whether the PID exists
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        return False


def _measure_clock_offset(comm: MPI.Comm) -> float:
    """Each worker's offset to rank 0's ``perf_counter`` by ping-pong (Cristian's method).

    The estimate from the round trip with the smallest delay is kept; its error is at most half that
    round trip (microseconds on a node, tens of microseconds across a fast network). Rank 0 takes the
    ranks one at a time; a rank sleeps until its turn comes (a polled receive of rank 0's go), and
    once measured until the last rank is (a polled barrier). Spinning in a blocking call instead, with
    more ranks than cores, the other ranks held the pair at work off the cores, for round trips of
    milliseconds: offsets 1.3 ms off with 5 ranks on 2 cores, 2.3 ms for the last rank under Open MPI.
    """
    buf = np.zeros(1, dtype=np.float64)
    if comm.Get_rank() == 0:
        for worker_rank in range(1, comm.Get_size()):
            comm.Send(buf, dest=worker_rank, tag=CLOCK_TAG)  # your turn
            for _ in range(CLOCK_ROUNDS):
                comm.Recv(buf, source=worker_rank, tag=CLOCK_TAG)
                buf[0] = time.perf_counter()
                comm.Send(buf, dest=worker_rank, tag=CLOCK_TAG)
        _sleep_until(comm.Ibarrier())
        return 0.0
    _sleep_until(comm.Irecv(buf, source=0, tag=CLOCK_TAG))
    best_rtt, offset = float("inf"), 0.0
    for _ in range(CLOCK_ROUNDS):
        ta = time.perf_counter()
        comm.Send(buf, dest=0, tag=CLOCK_TAG)
        comm.Recv(buf, source=0, tag=CLOCK_TAG)
        tb = time.perf_counter()
        if tb - ta < best_rtt:
            best_rtt, offset = tb - ta, float(buf[0]) - (ta + tb) / 2
    _sleep_until(comm.Ibarrier())
    return offset


def _sleep_until(request) -> None:
    """Complete `request`, sleeping 0.1 ms between polls (start-up only: no deadline, no notices)."""
    while not request.Test():
        time.sleep(1e-4)


def open_rank_trace(ctx: Context, job, run_dir, *, role: str, backend: str, device: str, append: bool = False):
    """This rank's trace file in `run_dir`, with the root attributes every rank writes (docs/design.md,
    "Run outputs"): run id, rank, role, world size, host, pid, backend, device, MPI library, package
    version, the resolved job and the clock offset to rank 0, and the run's identity
    (``ebsp_mpi.identity``). With `append` (a resumed run), the rank's file is continued."""
    identity = ctx.identity.as_dict() if ctx.identity is not None else {"run_id": run_dir.name}
    attrs = dict(run_id=identity["run_id"], identity=identity, rank=ctx.rank, role=role, world_size=ctx.size,
                 host=ctx.host, pid=os.getpid(),
                 backend=backend, device=device, mpi_library=mpi_library(), package_version=__version__,
                 config=to_dict(job), clock_offset_s=ctx.clock_offset)
    return open_trace(run_dir, ctx.rank, attrs, enabled=job.trace.enabled, flush_seconds=job.trace.flush_seconds,
                      append=append)


def mpi_library() -> str:
    """The MPI library's first version line, e.g. ``MPICH Version: 4.2.0`` or ``Open MPI v5.0.11,
    package: ...`` (whose text ends with the C string's NUL byte, dropped here)."""
    return clean_text(MPI.Get_library_version()).strip().splitlines()[0].strip()


class Backoff:
    """What a rank does each time a poll finds nothing: sleep a little longer each time, from `first_s`
    up to `max_s`, or, with `spin`, only yield the core.

    Blocking MPI waits spin on a core; with more ranks than cores (5 ranks on a 2-core laptop) a
    spinning server steals the workers' compute. Polling with a short sleep costs at most `max_s` of
    latency on an idle rank and nothing on a busy one. But MPICH moves a large message only while
    both ends poll (the receiver copies it, the sender must see the receipt), and every poll that
    comes late adds its delay to each message of a push or a reply; so where every rank has a core of
    its own (``Context.oversubscribed`` false), waiting ranks poll without sleeping and give the core
    away only to whatever else is ready to run (``sched_yield``).

    The longest sleep, 0.2 ms, bounds the latency a sleeping wait adds; an idle rank then wakes at
    most 5,000 times a second. Measured on 2 cores against 1 ms: 1 - 18 % more iterations per second
    in 5-rank runs, and the 2-worker round trip of ``bench ps`` at 1e6 parameters in 3.6 - 4.0 ms
    instead of 7.2 - 7.4 ms; 50 us was worse again (README, "Performance").
    """

    def __init__(self, first_s: float = 2e-5, max_s: float = 2e-4, spin: bool = False):
        self.first_s, self.max_s, self.spin = first_s, max_s, spin
        self.delay = first_s

    def reset(self) -> None:
        self.delay = self.first_s

    def idle(self) -> None:
        if self.spin:
            os.sched_yield()
            return
        time.sleep(self.delay)
        self.delay = min(self.max_s, self.delay * 2)


def wait_all(requests, backoff: Backoff, silence: Silence | None = None, on_done=None, on_idle=None) -> None:
    """Complete `requests` (a list) by polling with back-off instead of spinning in ``Waitall``.

    Each request that completes resets the back-off: the next part of a multi-message push or reply
    is then seen at once, not after the longest sleep. With `silence`, each one also counts as word
    from the peer, and a wait that hears nothing for its timeout raises :class:`StallError`.
    ``on_done(indices)`` is told which requests completed (to name the peers still silent);
    ``on_idle()`` runs between polls that find nothing (a server's keep-alives while it waits).
    """
    backoff.reset()
    while (done := MPI.Request.Testsome(requests)) is not None:  # None: no request left active
        if done:
            backoff.reset()
            if on_done is not None:
                on_done(done)
            if silence is not None:
                silence.heard()
        else:
            if silence is not None:
                silence.check()
            if on_idle is not None:
                on_idle()
            backoff.idle()


class KeepAlive:
    """Keep-alive messages (``protocol.ALIVE_TAG``) from this rank to the peers that watch it: one to
    each peer that has been told nothing for a quarter of the stall timeout, so that the peer's
    watchdog fires on a dead or stopped rank, never on one that merely has nothing to say.

    Parameters
    ----------
    comm : MPI.Comm
    stall_timeout_s : float
        ``runtime.stall_timeout_s``.
    """

    def __init__(self, comm, stall_timeout_s: float):
        self.comm, self.interval = comm, stall_timeout_s / 4
        self.last_told: dict[int, float] = {}  # rank -> when this rank last sent it anything
        self.sends: list = []

    def told(self, rank: int, now: float) -> None:
        """A message went to `rank` at `now` (a reply, orders): it says as much as a keep-alive."""
        self.last_told[rank] = now

    def tick(self, now: float, ranks) -> None:
        """Send a keep-alive to each of `ranks` told nothing for a quarter of the stall timeout (at
        once to one never told anything), and let go of the sends that have completed."""
        for rank in ranks:
            if now - self.last_told.get(rank, -math.inf) >= self.interval:
                self.sends.append(self.comm.Isend([ALIVE, MPI.DOUBLE], rank, ALIVE_TAG))
                self.last_told[rank] = now
        self.sends = [r for r in self.sends if not r.Test()]

    def part(self, ranks) -> None:
        """The last keep-alive to each of `ranks`: :data:`PARTING`, after which none follows."""
        for rank in ranks:
            self.sends.append(self.comm.Isend([PARTING, MPI.DOUBLE], rank, ALIVE_TAG))

    def wait(self, backoff: Backoff) -> None:
        """Complete the keep-alives still in flight (small: complete already, or soon)."""
        wait_all(self.sends, backoff)


def abort(ctx: Context | None, exc: BaseException) -> None:
    """Print which rank failed and why, then take the whole job down (never leave ranks hanging)."""
    rank = ctx.rank if ctx is not None else MPI.COMM_WORLD.Get_rank()
    role = ctx.role_of(rank) if ctx is not None else role_name(rank, 1)
    if isinstance(exc, (UsageError, OutputError, KeyboardInterrupt, JobFailure)):
        note = node_note(exc.ranks, ctx.hosts, rank, ctx.servers) if isinstance(exc, StallError) and ctx else ""
        text = f"ebsp_mpi: rank {rank} ({role}) stopped: {type(exc).__name__}: {exc}{note}\n"
    else:
        text = "".join(traceback.format_exception(exc)) + \
            f"ebsp_mpi: rank {rank} ({role}) failed: {type(exc).__name__}: {exc}\n"
    sys.stderr.write(text)
    sys.stderr.flush()
    # MPI_Abort makes the launcher kill every rank at once, and MPICH's Hydra may drop what it has not yet
    # forwarded from the ranks' pipes: give the message a moment to get out first
    time.sleep(ABORT_GRACE_S)
    # the kernel's timer, not a thread: SIGALRM's default action ends the process wherever it is blocked
    # (faulthandler's watchdog thread did not outlast MPICH's abort path)
    if hasattr(signal, "alarm"):
        signal.signal(signal.SIGALRM, signal.SIG_DFL)
        signal.alarm(math.ceil(ABORT_BOUND_S))
    MPI.COMM_WORLD.Abort(2 if isinstance(exc, UsageError) else 1)


def node_note(silent, hosts: list[str], rank: int, servers: int) -> str:
    """Every rank on the nodes of the `silent` ranks, for a stall's message: when a node is lost (its
    link cut, its processes killed), the rank that stops names the one peer it waited for, but every
    rank of that node is gone with it. Nodes of this `rank`'s own are left out (it runs, so its node is
    not lost), and so is all of it where `hosts` (every rank's, by rank) is not known."""
    if not hosts:
        return ""
    nodes = sorted({hosts[r] for r in silent if 0 <= r < len(hosts) and hosts[r] != hosts[rank]})
    parts = [f"{node} runs " + ", ".join(f"rank {r} ({role_name(r, servers)})"
                                         for r, host in enumerate(hosts) if host == node) for node in nodes]
    return f"; a lost node takes all its ranks: {'; '.join(parts)}" if parts else ""
