"""Dynamic Stale Synchronous Parallel: SSP whose staleness threshold moves in [s, s + r] at run time.

Zhao, An, Liu, Chen, "Dynamic Stale Synchronous Parallel Distributed Training for Deep Learning",
ICDCS 2019 (arXiv:1908.11848), Sec. III-IV. The paper's server keeps the recent push timestamps of
every worker. A worker within the lower bound s_L = s of the slowest worker goes on as in SSP. When a
worker's push takes it past the lower bound, a *synchronization controller* predicts, from the most
recent iteration intervals, when the slowest worker will push next and lets the worker run
r* in [0, r_max] extra iterations, r* chosen so that the worker's predicted push lands closest to the
slowest worker's predicted push (least waiting); past s + r* it is held as in SSP.

How this module reads the paper, where it leaves choices open (each choice keeps DSSP between
SSP(s) and SSP(s + r), and DSSP with r = 0 identical to SSP(s)):

- **Per-worker threshold.** Worker i carries a threshold s_i in [s, s + r] (iterations ahead of the
  slowest). A push with lead ``done_i - min_j done_j <= s`` is released and resets s_i = s. A push past
  s runs the controller, which sets s_i = s + r* on the first crossing; the worker is then released
  while its lead is <= s_i and held at lead s_i + 1 until the minimum rises enough (SSP with bound
  s_i). The paper counts the extra iterations down (r_p); a threshold is the same count expressed as
  a lead, and it keeps the hard upper bound s + r when the slowest worker pushes in between.
- **Re-planning.** The paper calls the controller again when the extra iterations are used up and the
  worker is still past s_L. Here too: after a planned hold ends, the next push past s asks the
  controller again, with the iterations still allowed, ``s + r + 1 - lead``, as the range of r*
  (so the threshold never exceeds s + r). On the first crossing (lead s + 1) that range is [0, r].
- **Every worker, not only the fastest.** The paper runs the controller only for the fastest worker;
  with several equally fast workers that lets whichever arrives first run ahead while its twins wait,
  an artefact of arrival order, so any worker past the lower bound is planned for (docs/design.md).
- **Intervals.** A worker's iteration interval is the time from its last release (weights answered)
  to its last push: the paper's push-to-push interval without the time the server held it, which is
  the server's doing, not the worker's speed. A worker with fewer than two pushes has no usable
  interval (the first iteration carries start-up costs), and then the controller answers r* = 0:
  plain SSP(s).
- **The slowest worker's next push** is predicted for every active worker tied at the minimum as its
  current release time plus its interval; the latest of those is when the minimum will rise.
- **Closest** is ``|t + k * interval_i - t_slowest|`` over k in the allowed range, where k = 0 means
  "held now"; ties go to the smaller k.

Decisions of the controller are kept in :attr:`DSSP.last_plan` and counted in
:attr:`DSSP.controller_calls`; no trace rows are written (the trace schema has no DSSP table).
"""

from __future__ import annotations

import heapq
import math
from typing import NamedTuple

import numpy as np

from .base import NOTHING, Decision
from .ssp import SSP, check_count

#: Pushes a worker needs before its latest interval is trusted (the first includes start-up).
MIN_HISTORY = 2


class DSSPPlan(NamedTuple):
    """One answer of the synchronization controller (Zhao et al. 2019, Sec. IV).

    Attributes
    ----------
    worker : int
        The worker past the lower bound.
    t : float
        Time of its push (seconds since the run's start).
    lead : int
        ``done_i - min_j done_j`` after the push (iterations).
    extra : int
        Iterations it may still run before being held (0: held now).
    threshold : int
        Its new threshold s_i = lead - 1 + extra, in [s, s + r].
    interval : float or None
        Its predicted iteration interval (seconds); None when its history is too short.
    slowest_push : float or None
        Predicted time the minimum rises (seconds); None when unpredictable.
    """

    worker: int
    t: float
    lead: int
    extra: int
    threshold: int
    interval: float | None
    slowest_push: float | None


class DSSP(SSP):
    """Dynamic SSP over ``workers`` workers with threshold range [staleness, staleness + dssp_range].

    Parameters
    ----------
    workers : int
        Number of workers.
    staleness : int
        The lower bound s (s_L in the paper), iterations.
    dssp_range : int
        r (r_max = s_U - s_L in the paper): how many extra iterations the controller may grant.

    Notes
    -----
    The controller's prediction of the slowest workers' next push is the maximum, over the workers at
    the minimum count, of release time plus interval. It is kept per push count in a max-heap of
    (predicted push, worker) entries, one added whenever a worker's interval or release time changes;
    entries outdated since (a later change, a later push, a departure) are dropped when they reach the
    top. A controller call thus costs O(log n) amortised instead of a scan of every worker.
    """

    name = "dssp"

    def __init__(self, workers: int, staleness: int = 3, dssp_range: int = 3):
        super().__init__(workers, staleness)
        self.dssp_range = check_count("dssp_range", dssp_range)
        self._threshold = [self.staleness] * workers
        # True while a worker runs the extra iterations of a plan (no new plan until it is held).
        self._planned = [False] * workers
        self._released_at = [math.nan] * workers
        self._interval = [math.nan] * workers
        # push count -> heap of (-predicted next push, worker, stamp); stamp[w] counts w's changes
        self._next: dict[int, list[tuple[float, int, int]]] = {}
        self._stamp = [0] * workers
        # workers with MIN_HISTORY pushes or more whose next push cannot be predicted (after a resume)
        self._unknown: set[int] = set()
        # the controller's most recent answer, as DSSPPlan's fields (made into one when asked for)
        self._last_plan: tuple | None = None
        #: How many times the controller was asked.
        self.controller_calls = 0

    @property
    def last_plan(self) -> DSSPPlan | None:
        """The controller's most recent answer (None before its first call)."""
        return None if self._last_plan is None else DSSPPlan(*self._last_plan)

    @property
    def threshold(self) -> np.ndarray:
        """Current threshold s_i of every worker (iterations ahead of the slowest; a copy)."""
        return np.array(self._threshold, dtype=np.int64)

    def load_state_dict(self, state: dict) -> None:
        super().load_state_dict(state)
        self._next.clear()
        for w in range(self.workers):
            self._note(w)

    # -- protocol hooks: keep the timestamps the controller predicts from -------------------------

    def start(self, t: float) -> Decision:
        decision = super().start(t)
        self._released(decision.release, t)
        return decision

    def _decide_push(self, worker: int, t: float) -> Decision:
        # SSP's decision (SSP._decide_push) with DSSP's admission, bound and timestamps, in one piece:
        # a simulation makes millions of these calls, and each call saved is a tenth of a microsecond.
        self._interval[worker] = t - self._released_at[worker]
        previous = self._floor
        floor = self._floor = self._min
        release = []
        if floor > previous:
            for level in range(previous, floor):  # nobody is at these counts any more
                self._next.pop(level, None)
            release = self._freed(previous, floor)
        if self._admit(worker, t, floor):
            release.append(worker)
        else:
            # held until the minimum reaches done_i - s_i (SSP._hold with DSSP's bound)
            self._waiting.setdefault(self._done[worker] - self._threshold[worker], []).append(worker)
            if not self.staleness:
                # With s = 0 (so s_i may be 0) the push that raises the minimum to done_i both frees
                # the worker and asks the controller for the minimum's count, done_i, before the
                # worker's release files its new prediction: the held one (last release plus the new
                # interval) is read. With s >= 1 it never is, so it is not filed: a push raises the
                # minimum by one at most, so a held worker goes while the minimum is still below its
                # count (a departure may raise it further, but asks the controller nothing), and its
                # release files a newer one.
                self._note(worker)
            if not release:
                return NOTHING
        self._released(release, t)
        if len(release) == 1:
            return self._alone[release[0]]
        release.sort()
        return Decision(release=tuple(release))

    def _decide_leave(self, worker: int, t: float) -> Decision:
        previous = self._floor
        decision = super()._decide_leave(worker, t)
        for level in range(previous, self._floor):
            self._next.pop(level, None)
        self._unknown.discard(worker)
        self._released(decision.release, t)
        return decision

    def _released(self, workers, t: float) -> None:
        for w in workers:
            self._released_at[w] = t
            self._note(w)

    def _note(self, w: int) -> None:
        """Worker ``w``'s predicted next push (release time plus interval) changed: file it under its count."""
        stamp = self._stamp[w] = self._stamp[w] + 1
        d = self._done[w]
        if d < MIN_HISTORY:  # never asked for: the controller predicts nothing below MIN_HISTORY
            return
        value = self._released_at[w] + self._interval[w]
        if value - value == 0.0:  # finite
            if self._unknown:
                self._unknown.discard(w)
            heap = self._next.get(d)
            if heap is None:
                heap = self._next[d] = []
            heapq.heappush(heap, (-value, w, stamp))
        else:
            self._unknown.add(w)

    # -- the model -----------------------------------------------------------------------------

    def _admit(self, worker: int, t: float, floor: int) -> bool:
        lead = self._done[worker] - floor
        if lead <= self.staleness:
            self._threshold[worker] = self.staleness
            self._planned[worker] = False
            return True
        if self._planned[worker]:
            if lead <= self._threshold[worker]:
                return True
            # The planned hold: wait for the slowest (SSP with bound s_i); plan anew afterwards.
            self._planned[worker] = False
            return False
        extra = self._plan(worker, t, lead)
        self._threshold[worker] = lead - 1 + extra
        self._planned[worker] = extra > 0
        return extra > 0

    def _plan(self, worker: int, t: float, lead: int) -> int:
        """The synchronization controller: extra iterations for ``worker``, past the lower bound at ``t``."""
        self.controller_calls += 1
        # A push can only be released with lead <= s + r, so the next push has lead <= s + r + 1.
        most = self.staleness + self.dssp_range + 1 - lead
        interval = self._interval[worker]  # finite: the worker has pushed since its release
        if self._done[worker] < MIN_HISTORY or not interval - interval == 0.0:
            interval = None
        slowest = self._predict_slowest_push(self._min)
        extra = 0
        if most > 0 and interval is not None and slowest is not None:
            # Worker's k-th next push lands at t + k * interval (k = 0: it is held now); a strict <
            # keeps the first of equal distances: ties -> smaller k
            best = abs(t - slowest)
            for k in range(1, most + 1):
                distance = abs(t + k * interval - slowest)
                if distance < best:
                    best, extra = distance, k
        self._last_plan = (worker, t, lead, extra, lead - 1 + extra, interval, slowest)
        return extra

    def _predict_slowest_push(self, floor: int) -> float | None:
        """When the minimum `floor` over the active workers (one at least) rises: the latest next push
        of those at the minimum."""
        if floor < MIN_HISTORY:
            return None
        if self._unknown and any(self._done[w] == floor for w in self._unknown):
            return None
        heap = self._next.get(floor)
        done, stamps, active = self._done, self._stamp, self.active
        while heap:
            value, w, stamp = heap[0]
            if stamp == stamps[w] and done[w] == floor and w in active:
                return -value
            heapq.heappop(heap)
        return None
