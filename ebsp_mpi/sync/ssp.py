"""Stale Synchronous Parallel: pushes applied on arrival, a worker may run at most s iterations ahead.

Ho et al., "More effective distributed ML via a stale synchronous parallel parameter server",
NIPS 2013. With ``done_i`` the pushes of worker i, worker i may start its next iteration only while
``done_i - min_j done_j <= s`` over the active workers; otherwise its pull is held until the slowest
worker catches up (docs/design.md "Synchronization models"). ``s = 0`` is lockstep, although unlike BSP
each gradient is still applied on arrival as its own optimizer step.
"""

from __future__ import annotations

import operator

from .base import NOTHING, Decision, SyncPolicy


def check_count(name: str, value) -> int:
    """Return ``value`` as an int if it is a non-negative integer, else raise ``ValueError``.

    Parameters
    ----------
    name : str
        The parameter's name, for the message (e.g. ``"staleness"``).
    value : int
        The value to check (bools are refused: ``True`` is no iteration count).
    """
    try:
        if isinstance(value, bool):
            raise TypeError
        count = operator.index(value)
    except TypeError:
        raise ValueError(f"{name} must be a non-negative integer (iterations), got {value!r}") from None
    if count < 0:
        raise ValueError(f"{name} must be a non-negative integer (iterations), got {count}")
    return count


class SSP(SyncPolicy):
    """Stale Synchronous Parallel with staleness bound ``staleness`` (s, in iterations).

    A push is applied on arrival. The pusher is released when ``done_i - min_j done_j <= s`` over
    the active workers; otherwise it is held, and every later push that raises the minimum (a push of
    the slowest worker) or a departure releases all held workers that are back within the bound.
    SSP writes no trace rows of its own.

    Parameters
    ----------
    workers : int
        Number of workers.
    staleness : int
        The bound s >= 0 (iterations); 0 is lockstep.
    """

    name = "ssp"

    def __init__(self, workers: int, staleness: int = 3):
        super().__init__(workers)
        self.staleness = check_count("staleness", staleness)
        # min_j done_j at the last decision: held workers can only become free when it rises.
        self._floor = 0
        # held workers by the minimum at which they go: done_i - bound_i (their count and bound do not
        # change while they are held), so a rise of the minimum frees its own list and scans no one else
        self._waiting: dict[int, list[int]] = {}

    def load_state_dict(self, state: dict) -> None:
        super().load_state_dict(state)
        self._floor = self.min_done()
        self._waiting.clear()

    def lead(self, worker: int) -> int:
        """How many iterations ``worker`` is ahead of the slowest active worker: done_i - min_j done_j."""
        return self._done[worker] - self.min_done()

    def _decide_push(self, worker: int, t: float) -> Decision:
        floor = self._min
        previous, self._floor = self._floor, floor
        admitted = self._admit(worker, t, floor)
        freed = self._freed(previous, floor) if floor > previous else []
        if not admitted:
            self._hold(worker)
            return Decision(release=tuple(sorted(freed))) if freed else NOTHING
        if not freed:
            return self._alone[worker]
        freed.append(worker)
        return Decision(release=tuple(sorted(freed)))

    def _decide_leave(self, worker: int, t: float) -> Decision:
        # The minimum over the remaining workers can only be the same or higher.
        previous, self._floor = self._floor, self.min_done()
        return Decision(release=tuple(sorted(self._freed(previous, self._floor))))

    # -- what DSSP refines -----------------------------------------------------------------------

    def _admit(self, worker: int, t: float, floor: int) -> bool:
        """May ``worker``, which just pushed at ``t``, start its next iteration now?"""
        return self._done[worker] - floor <= self.staleness

    # -- helpers -----------------------------------------------------------------------------

    def _hold(self, worker: int) -> None:
        """Keep the held ``worker`` until the minimum reaches done_i - s (DSSP writes its own, with s_i)."""
        self._waiting.setdefault(self._done[worker] - self.staleness, []).append(worker)

    def _freed(self, previous: int, floor: int) -> list[int]:
        """Held workers whose lead is back within their bound now that the minimum rose from
        ``previous`` to ``floor`` (a worker that left meanwhile is not held any more)."""
        freed = []
        for f in range(previous + 1, floor + 1):
            freed += [w for w in self._waiting.pop(f, ()) if w in self.held]
        return freed
