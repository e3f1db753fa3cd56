"""A discrete-event simulation of virtual workers whose sync decisions the coordinator makes (no MPI,
no arrays of weights).

Each worker repeats: receive weights (be *released*), compute for its iteration interval, *push*.
The simulation feeds the pushes in time order to the same :class:`~.coordinator.Coordinator` the
parameter server uses, and carries out its actions: a reply starts the worker's next iteration or
stops it. It decides nothing itself, so the limits, the time limit, BSP's rounds and the departures
are the server's. It is deterministic: pushes at equal times are handled in worker order. It serves
the unit tests (invariants of every model) and ``python -m ebsp_mpi simulate`` (:mod:`ebsp_mpi.sim`),
which writes what it observed as a run directory.

A worker released at time r for its k-th iteration (k = 0, 1, ...) pushes at r + interval(w, k, r).
After its ``iterations``-th push it gets its stop reply at once; with a time limit ``until``, a
worker released at ``t >= until`` gets a stop reply instead of weights.

The *wait* of a push is the time from the push to the worker's next release (the pull held by the
sync model); a worker's last push has no wait, unless the time limit stopped it while held.

Versions count optimizer steps as the server does: every push is one, except under a ``round_based``
policy (BSP), where a completed round with pushes in it is one. Each iteration records the version it
started from and the version its push found on arrival; their difference is the push's staleness.

Cost per push: a heap operation, the coordinator's and the policy's calls (O(log n) or amortised
O(1), see :mod:`ebsp_mpi.sync.base`) and a few appends to per-worker arrays (8 bytes each), so that a run of
millions of pushes fits in memory. ``bench simulate`` measures it against a bare :mod:`heapq` loop.
"""

from __future__ import annotations

import heapq
import math
from array import array
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

from ..sync.base import Record, SyncPolicy
from ..sync.coordinator import Coordinator, Executor

#: Per-worker constant intervals (seconds); ``interval(worker, k)`` for worker's k-th iteration; an
#: (n, m) array whose row w worker w cycles through; or an object with ``interval(worker, k, t)`` (t:
#: the release time, for slow phases in run time).
Intervals = Sequence[float] | Callable[[int, int], float] | np.ndarray | object

#: Pushes between two calls of the ``progress`` callback.
PROGRESS_EVERY = 1 << 16


class SimulationDeadlock(RuntimeError):
    """The policy held workers that no future event can release."""


@dataclass(frozen=True)
class Release:
    """One decision that released workers.

    Attributes
    ----------
    t : float
        Time of the decision (seconds).
    workers : tuple of int
        The released workers.
    done : tuple of int
        Their push counts at the release (same order as ``workers``).
    floor : int
        ``min_j done_j`` over the active workers at the release.
    active : int
        How many workers were active at the release (the released included).
    apply_round : bool
        The decision's ``apply_round`` (BSP completed a round).
    """

    t: float
    workers: tuple[int, ...]
    done: tuple[int, ...]
    floor: int
    active: int
    apply_round: bool

    def leads(self) -> tuple[int, ...]:
        """Iterations each released worker is ahead of the slowest: done_i - min_j done_j."""
        return tuple(d - self.floor for d in self.done)


@dataclass
class SimResult:
    """What :func:`simulate` observed.

    Attributes
    ----------
    policy : str
        The policy's name.
    start, push : list of numpy.ndarray
        Per worker, per iteration: its release time and its push time (float64, seconds).
    used, before : list of numpy.ndarray
        Per worker, per iteration: the version it started from, and the version its push found (int64).
    end : numpy.ndarray
        Per worker, when it stopped (its last push, or the release that stopped it), seconds.
    stop_version : numpy.ndarray
        Per worker, the version of the reply that stopped it (int64).
    wait : numpy.ndarray
        Per worker, total seconds its pulls were held (float64, shape (workers,)).
    releases : list of Release
        Every decision that released someone, in time order (``start`` first); empty when
        :func:`simulate` was asked not to keep them.
    barriers : int
        The policy's barrier count at the end.
    versions : int
        Optimizer steps applied (the final version).
    records : list of Record
        The policy's trace rows (barriers, ZipLine calls), in the order it made them.
    """

    policy: str
    start: list[np.ndarray]
    push: list[np.ndarray]
    used: list[np.ndarray]
    before: list[np.ndarray]
    end: np.ndarray
    stop_version: np.ndarray
    wait: np.ndarray
    releases: list[Release] = field(default_factory=list)
    barriers: int = 0
    versions: int = 0
    records: list[Record] = field(default_factory=list)

    @property
    def workers(self) -> int:
        return len(self.start)

    @property
    def pushes(self) -> int:
        """Pushes of all workers."""
        return sum(len(p) for p in self.push)

    @property
    def iterations(self) -> list[list[tuple[float, float]]]:
        """Per worker, per iteration: (release time, push time), seconds (built on each call)."""
        return [list(zip(s.tolist(), p.tolist(), strict=True)) for s, p in zip(self.start, self.push, strict=True)]

    @property
    def makespan(self) -> float:
        """Time of the last push (seconds)."""
        return max((float(p[-1]) for p in self.push if len(p)), default=0.0)

    def waits(self, worker: int) -> list[float]:
        """Seconds each push of ``worker`` but the last waited for its release."""
        return (self.start[worker][1:] - self.push[worker][:-1]).tolist()


def simulate(policy: SyncPolicy, intervals: Intervals, iterations: int | None = None, *, t0: float = 0.0,
             until: float = math.inf, keep_releases: bool = True,
             progress: Callable[[int], None] | None = None, limits: Sequence[int | None] | None = None,
             trainer: Trainer | None = None, recorded: Sequence[tuple[float, int]] | None = None) -> SimResult:
    """Run ``policy.workers`` virtual workers for ``iterations`` iterations each (or until ``until``).

    Parameters
    ----------
    policy : SyncPolicy
        A fresh policy (nobody has pushed yet); it is driven in place.
    intervals : see :data:`Intervals`
        Seconds from a worker's release to its push (compute plus push).
    iterations : int, optional
        Iterations (pushes) each worker does before it leaves (>= 1); None: only ``until`` stops.
    t0 : float
        Start time (seconds).
    until : float
        Time limit (seconds): a worker released at or after it stops (``stop.seconds``).
    keep_releases : bool
        Keep every release decision in :attr:`SimResult.releases` (the tests read them; a large run
        need not).
    progress : callable, optional
        Called with the pushes so far every :data:`PROGRESS_EVERY` pushes.
    limits : sequence of int or None, optional
        Per worker, its iterations (as the server's ``stop.epochs`` gives each its own); in place of
        ``iterations``.
    trainer : Trainer, optional
        Real weights (``simulate --train``): told of every release and push, it computes the gradients
        and carries out the applies and rounds (:class:`Trainer`).
    recorded : sequence of (t, worker), optional
        Take the pushes in this order at these times (a recorded run's, replayed exactly) instead of
        scheduling them from ``intervals``; a push whose worker is not computing at that point is a
        :class:`ReplayMismatch`.

    Returns
    -------
    SimResult

    Raises
    ------
    ValueError
        For bad intervals, iteration counts or time limits.
    SimulationDeadlock
        When workers are still held and no push is pending.
    RuntimeError
        When the policy releases a worker whose pull is not pending.
    """
    interval = None if recorded is not None else interval_function(intervals, policy.workers)
    limits = _checked_limits(iterations, limits, policy.workers, until)
    run = Simulation(Coordinator(policy, limits, until), interval, keep_releases, t0, trainer)
    run.start(t0)
    if recorded is not None:
        run.replay(recorded)
    else:
        run.loop(progress)
    return run.result()


def _checked_limits(iterations, limits, n: int, until: float) -> list:
    """Per worker, its iterations: `limits`, else `iterations` for every worker; with no time limit,
    every worker needs one."""
    if iterations is not None and (isinstance(iterations, bool) or not isinstance(iterations, (int, np.integer))
                                   or iterations < 1):
        raise ValueError(f"iterations must be an integer >= 1, got {iterations!r}")
    limits = [iterations] * n if limits is None else list(limits)
    if None in limits and not until < math.inf:
        raise ValueError("simulate needs an iteration count or a finite time limit (until)")
    return limits


class ReplayMismatch(RuntimeError):
    """A recorded push that the policy, given the recorded pushes before it, would not have let happen."""


class RecordingExhausted(ReplayMismatch):
    """The recorded pushes ran out while workers were still computing: the replay's limits go past the
    recording's (more iterations, or a later time limit, than the recorded run had)."""


class Trainer:
    """What ``simulate`` tells a driver of real weights (:mod:`ebsp_mpi.sim.training`); every method
    is called at the event's point in the order of the coordinator's actions."""

    def released(self, worker: int, version: int) -> None:
        """`worker` starts an iteration on the weights of `version` (the current ones)."""

    def pushed(self, worker: int, t: float) -> bool:
        """`worker` pushes at `t`: compute its gradient; True when it is rejected (NaN or Inf)."""
        return False

    def apply(self, worker: int, version: int) -> None:
        """Apply `worker`'s push as one step at the learning rate of `version`."""

    def round(self, members: tuple[int, ...], version: int) -> None:
        """BSP: the mean of `members`' pushes as one step at the learning rate of `version`."""

    def reject(self, worker: int) -> None:
        """`worker`'s push held NaN or Inf: drop it."""


class Simulation(Executor):
    """One simulation: the workers' records, the heap of pending pushes, and the coordinator's
    actions carried out on them (an :class:`~ebsp_mpi.sync.coordinator.Executor`: the coordinator
    calls :meth:`reply` and :meth:`round` as it decides, no action record made).

    The seam for a driver of its own (:mod:`.restarts`): :meth:`start` and :meth:`push` feed it
    events, :meth:`loop` takes the pending pushes in time order, :meth:`reply` is what a reply does to
    a virtual worker (a subclass that overrides it sets :attr:`plain` False, so that no reply is
    carried out without it), :meth:`result` is what was observed.
    """

    def __init__(self, coordinator: Coordinator, interval, keep_releases: bool, t0: float,
                 trainer: Trainer | None = None):
        n = coordinator.workers
        self.trainer = trainer
        self.coordinator, self.policy, self.interval = coordinator, coordinator.policy, interval
        self.keep_releases = keep_releases
        self.starts, self.pushes = [array("d") for _ in range(n)], [array("d") for _ in range(n)]
        self.used, self.before = [array("q") for _ in range(n)], [array("q") for _ in range(n)]
        self.wait, self.end, self.stop_version = [0.0] * n, [math.nan] * n, [0] * n
        self.pulled_at: list[float | None] = [t0] * n  # when a worker's pull became pending; None: not
        self.heap: list[tuple[float, int]] = []
        self.releases: list[Release] = []
        self.records: list[Record] = []
        self.now = t0  # the time of the event being carried out
        self.released: list[int] = []  # workers the event released (for a Release), with keep_releases
        self.closed = False  # the event closed a BSP round
        # no releases kept, no weights, intervals: reply's common case may be written out (a subclass
        # that overrides reply sets it False)
        self.plain = not keep_releases and trainer is None and interval is not None
        self.apply = None  # without weights, an apply has nothing to do (read here, not from the class)
        if trainer is not None:  # the weights step before the replies that follow read them
            self.apply = trainer.apply
            self.reject = lambda worker, iteration: trainer.reject(worker)

    # -- the coordinator's actions ---------------------------------------------------------------

    def reply(self, w: int, version: int, stop: bool, heappush=heapq.heappush) -> None:
        """`w` starts its next iteration on `version`, or stops."""
        t, pulled_at = self.now, self.pulled_at
        since = pulled_at[w]
        if since is None:
            raise RuntimeError(f"policy {self.policy.name!r} released worker {w} at t={t}, "
                               f"whose pull was not pending")
        pulled_at[w] = None
        self.wait[w] += t - since
        if stop:
            self.end[w], self.stop_version[w] = t, version
            return
        self.starts[w].append(t)
        self.used[w].append(version)
        if self.plain:  # most of a large simulation's replies
            heappush(self.heap, (t + self.interval(w, self.coordinator.pushes[w], t), w))
            return
        if self.keep_releases:
            self.released.append(w)
        if self.trainer is not None:
            self.trainer.released(w, version)
        if self.interval is not None:  # None: the pushes come from a recording
            heappush(self.heap, (t + self.interval(w, self.coordinator.pushes[w], t), w))

    def round(self, members: tuple[int, ...], version: int, released: list[tuple[int, bool]]) -> None:
        """BSP: the round's step (with weights), then its replies."""
        if self.trainer is not None:
            self.trainer.round(members, version)
        self.closed = True
        after = version + 1 if members else version
        if not self.plain:
            for w, stop in released:
                self.reply(w, after, stop)
            return
        # reply() written out for a round's every worker (BSP's cost per push is mostly this)
        t, pulled_at, wait, starts, used, heap, interval, pushes = self.now, self.pulled_at, self.wait, self.starts, \
            self.used, self.heap, self.interval, self.coordinator.pushes
        for w, stop in released:
            since = pulled_at[w]
            if since is None or stop:
                self.reply(w, after, stop)
                continue
            pulled_at[w] = None
            wait[w] += t - since
            starts[w].append(t)
            used[w].append(after)
            heapq.heappush(heap, (t + interval(w, pushes[w], t), w))

    def record(self, record: Record) -> None:
        self.records.append(record)

    # -- the events --------------------------------------------------------------------------------

    def start(self, t: float) -> None:
        """Every worker pulls the initial weights."""
        self.now = t
        self.coordinator.start_to(self, t)
        self._kept(t)

    def push(self, w: int, t: float) -> None:
        """One push, the general way: recorded, the trainer told, the coordinator's actions carried out."""
        self.pushes[w].append(t)
        self.before[w].append(self.coordinator.version)
        self.pulled_at[w] = t
        self.now = t
        rejected = self.trainer.pushed(w, t) if self.trainer is not None else False
        self.coordinator.push_to(self, w, t, rejected)
        self._kept(t)

    def _kept(self, t: float) -> None:
        """With keep_releases, the event's :class:`Release`."""
        released, closed = self.released, self.closed
        self.closed = False
        if self.keep_releases and released:
            policy = self.policy
            self.releases.append(Release(t, tuple(released), tuple(policy.pushes(w) for w in released),
                                         policy.min_done(), len(policy.active), closed))
            self.released = []

    def replay(self, recorded: Sequence[tuple[float, int]]) -> None:
        """Take the recorded pushes in their order; each must come from a worker that is computing. A
        worker that has stopped (the replay's own limits, below the recording's, ended it) leaves its
        later recorded pushes out: the same job with the same limits stops where the run did."""
        for k, (t, w) in enumerate(recorded):
            if w in self.coordinator.left:
                continue
            if self.pulled_at[w] is not None:
                raise ReplayMismatch(f"recorded push {k} (worker {w} at t={t:.6f} s) does not fit: under "
                                     f"{self.policy.name} worker {w} is held, waiting for its release at that point")
            self.push(w, t)
        computing = [w for w, since in enumerate(self.pulled_at) if since is None and w not in self.coordinator.left]
        if computing:
            w = computing[0]
            raise RecordingExhausted(
                f"the recording ends after {len(recorded)} pushes, with {len(computing)} worker(s) still "
                f"computing (worker {w} after {self.coordinator.pushes[w]} pushes)")

    def loop(self, progress) -> None:
        """Take the pushes in time order until none is pending."""
        heap, heappop, general = self.heap, heapq.heappop, self.keep_releases
        coordinator, push_to, pulled_at, trainer = self.coordinator, self.coordinator.push_to, self.pulled_at, \
            self.trainer
        push_append, before_append = [a.append for a in self.pushes], [a.append for a in self.before]
        events = 0
        while heap:
            t, w = heappop(heap)
            if general:  # the releases kept: every push the general way
                self.push(w, t)
            else:  # push() written out for speed
                push_append[w](t)
                before_append[w](coordinator.version)
                pulled_at[w] = t
                self.now = t
                push_to(self, w, t, False if trainer is None else trainer.pushed(w, t))
            events += 1
            if progress is not None and not events % PROGRESS_EVERY:
                progress(events)

    def result(self) -> SimResult:
        """What was observed; a policy that holds workers no push can release is a deadlock."""
        policy, count = self.policy, self.coordinator.pushes
        stuck = [w for w, since in enumerate(self.pulled_at) if since is not None]
        if stuck:
            raise SimulationDeadlock(
                f"policy {policy.name!r} holds workers {stuck[:20]}{'...' if len(stuck) > 20 else ''} with no "
                f"push pending (pushes done: {[count[w] for w in stuck[:20]]}, held: {sorted(policy.held)[:20]})")
        return SimResult(
            policy=policy.name, start=[_numpy(a, np.float64) for a in self.starts],
            push=[_numpy(a, np.float64) for a in self.pushes], used=[_numpy(a, np.int64) for a in self.used],
            before=[_numpy(a, np.int64) for a in self.before], end=np.array(self.end),
            stop_version=np.array(self.stop_version, dtype=np.int64), wait=np.array(self.wait),
            releases=self.releases, barriers=policy.barriers, versions=self.coordinator.version,
            records=self.records)


def _numpy(values: array, dtype) -> np.ndarray:
    """An array.array as a NumPy array without a copy (read-only)."""
    return np.frombuffer(values, dtype=dtype) if len(values) else np.zeros(0, dtype=dtype)


def interval_function(intervals: Intervals, n: int) -> Callable[[int, int, float], float]:
    """Turn ``intervals`` into a checked ``interval(worker, k, t)`` (seconds, finite, >= 0).

    An array is checked once, here; an object whose ``interval`` method checks its own values says so
    with a true ``checked`` attribute; anything else is checked at each call.
    """
    if hasattr(intervals, "interval"):
        if getattr(intervals, "checked", False):
            return intervals.interval
        raw = intervals.interval
    elif isinstance(intervals, np.ndarray) and intervals.ndim == 2:
        if intervals.shape[0] != n or intervals.shape[1] < 1:
            raise ValueError(f"intervals: expected an ({n}, m) array with m >= 1, got shape {intervals.shape}")
        bad = np.argwhere(~((intervals >= 0) & np.isfinite(intervals)))
        if len(bad):
            w, k = (int(x) for x in bad[0])
            raise ValueError(f"interval of worker {w}, iteration {k}: expected finite seconds >= 0, "
                             f"got {intervals[w, k]}")
        rows = intervals.astype(np.float64).tolist()
        m = intervals.shape[1]

        def cycled(w: int, k: int, t: float) -> float:
            return rows[w][k % m]

        return cycled
    elif callable(intervals):
        def raw(w: int, k: int, t: float, f=intervals) -> float:
            return f(w, k)
    else:
        values = [float(v) for v in intervals]
        if len(values) != n:
            raise ValueError(f"intervals: expected one per worker ({n}), got {len(values)}")

        def raw(w: int, k: int, t: float) -> float:
            return values[w]

    def interval(w: int, k: int, t: float) -> float:
        value = float(raw(w, k, t))
        if not 0.0 <= value < math.inf:
            raise ValueError(
                f"interval of worker {w}, iteration {k}: expected finite seconds >= 0, got {value}"
            )
        return value

    return interval
