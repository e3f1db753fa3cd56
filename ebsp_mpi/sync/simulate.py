"""A discrete-event simulation of virtual workers driven by a sync policy (no MPI, no arrays of weights).

Each worker repeats: receive weights (be *released*), compute for its iteration interval, *push*.
The simulation feeds the pushes to the policy in time order, exactly as the parameter server would,
and releases whom the policy names. It is deterministic: pushes at equal times are handled in worker
order. It serves the unit tests (invariants of every model) and, later, a ``simulate`` subcommand for
many workers.

Protocol as simulated (see :mod:`ebsp_mpi.sync.base`):

1. ``policy.start(t0)`` releases the workers for their first iteration.
2. A worker released at time r for its k-th iteration (k = 0, 1, ...) pushes at r + interval(w, k)
   and calls ``policy.on_push``.
3. After its ``iterations``-th push a worker stops: ``policy.on_push`` is still called (the gradient
   counts), any release of that worker is ignored, and ``policy.on_leave`` follows at the same time.

The *wait* of a push is the time from the push to the worker's next release (the pull held by the
sync model); a worker's last push has no wait.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

from .base import Decision, SyncPolicy

#: Per-worker constant intervals (seconds), or ``interval(worker, k)`` for worker's k-th iteration.
Intervals = Sequence[float] | Callable[[int, int], float]


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
    iterations : list of list of (float, float)
        Per worker, per iteration: (release time, push time), seconds.
    wait : numpy.ndarray
        Per worker, total seconds its pulls were held (float64, shape (workers,)).
    releases : list of Release
        Every decision that released someone, in time order (``start`` first).
    """

    policy: str
    iterations: list[list[tuple[float, float]]]
    wait: np.ndarray
    releases: list[Release] = field(default_factory=list)

    @property
    def makespan(self) -> float:
        """Time of the last push (seconds)."""
        return max((it[-1][1] for it in self.iterations if it), default=0.0)

    def waits(self, worker: int) -> list[float]:
        """Seconds each push of ``worker`` but the last waited for its release."""
        its = self.iterations[worker]
        return [its[k + 1][0] - its[k][1] for k in range(len(its) - 1)]


def simulate(policy: SyncPolicy, intervals: Intervals, iterations: int, *, t0: float = 0.0) -> SimResult:
    """Run ``policy.workers`` virtual workers for ``iterations`` iterations each.

    Parameters
    ----------
    policy : SyncPolicy
        A fresh policy (nobody has pushed yet); it is driven in place.
    intervals : sequence of float, or callable
        Seconds one iteration of a worker takes (compute plus push): one constant per worker, or a
        function ``interval(worker, k)`` of the worker and its 0-based iteration number.
    iterations : int
        Iterations (pushes) each worker does before it leaves (>= 1).
    t0 : float
        Start time (seconds).

    Returns
    -------
    SimResult

    Raises
    ------
    ValueError
        For bad intervals or iteration counts.
    SimulationDeadlock
        When workers are still held and no push is pending.
    RuntimeError
        When the policy releases a worker whose pull is not pending.
    """
    n = policy.workers
    interval_of = _interval_function(intervals, n)
    if isinstance(iterations, bool) or not isinstance(iterations, (int, np.integer)) or iterations < 1:
        raise ValueError(f"iterations must be an integer >= 1, got {iterations!r}")

    log: list[list[tuple[float, float]]] = [[] for _ in range(n)]
    wait = np.zeros(n)
    releases: list[Release] = []
    pending: list[tuple[float, int]] = []  # heap of (push time, worker)
    pulled_at: list[float | None] = [t0] * n  # time a worker's pull became pending; None: not pending

    def apply(decision: Decision, t: float, leaving: int = -1) -> None:
        released = tuple(w for w in decision.release if w != leaving)
        if not released:
            return
        releases.append(
            Release(t, released, tuple(int(policy.done[w]) for w in released), policy.min_done(),
                    len(policy.active), decision.apply_round)
        )
        for w in released:
            since = pulled_at[w]
            if since is None:
                raise RuntimeError(
                    f"policy {policy.name!r} released worker {w} at t={t}, whose pull was not pending"
                )
            pulled_at[w] = None
            wait[w] += t - since
            push_t = t + interval_of(w, len(log[w]))
            log[w].append((t, push_t))
            heapq.heappush(pending, (push_t, w))

    apply(policy.start(t0), t0)
    while pending:
        t, w = heapq.heappop(pending)
        pulled_at[w] = t
        last = len(log[w]) == iterations
        apply(policy.on_push(w, t), t, leaving=w if last else -1)
        if last:
            pulled_at[w] = None
            apply(policy.on_leave(w, t), t, leaving=w)

    stuck = [w for w in range(n) if pulled_at[w] is not None or len(log[w]) < iterations]
    if stuck:
        raise SimulationDeadlock(
            f"policy {policy.name!r} holds workers {stuck} with no push pending "
            f"(pushes done: {[int(policy.done[w]) for w in stuck]}, held: {sorted(policy.held)})"
        )
    return SimResult(policy.name, log, wait, releases)


def _interval_function(intervals: Intervals, n: int) -> Callable[[int, int], float]:
    """Turn ``intervals`` into a checked ``interval(worker, k)`` (seconds, finite, >= 0)."""
    if callable(intervals):
        raw = intervals
    else:
        values = [float(v) for v in intervals]
        if len(values) != n:
            raise ValueError(f"intervals: expected one per worker ({n}), got {len(values)}")
        raw = lambda w, k: values[w]  # noqa: E731

    def interval(w: int, k: int) -> float:
        value = float(raw(w, k))
        if not math.isfinite(value) or value < 0:
            raise ValueError(
                f"interval of worker {w}, iteration {k}: expected finite seconds >= 0, got {value}"
            )
        return value

    return interval
