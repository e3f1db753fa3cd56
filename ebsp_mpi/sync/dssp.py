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
  an artefact of arrival order, so any worker past the lower bound is planned for (DESIGN.md).
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

from dataclasses import dataclass

import numpy as np

from .base import Decision
from .ssp import SSP, check_count

#: Pushes a worker needs before its latest interval is trusted (the first includes start-up).
MIN_HISTORY = 2


@dataclass(frozen=True)
class DSSPPlan:
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
    """

    name = "dssp"

    def __init__(self, workers: int, staleness: int = 3, dssp_range: int = 3):
        super().__init__(workers, staleness)
        self.dssp_range = check_count("dssp_range", dssp_range)
        #: Current threshold s_i of every worker (iterations ahead of the slowest).
        self.threshold = np.full(workers, self.staleness, dtype=np.int64)
        # True while a worker runs the extra iterations of a plan (no new plan until it is held).
        self._planned = np.zeros(workers, dtype=bool)
        self._released_at = np.full(workers, np.nan)
        self._interval = np.full(workers, np.nan)
        #: The controller's most recent answer (None before its first call).
        self.last_plan: DSSPPlan | None = None
        #: How many times the controller was asked.
        self.controller_calls = 0

    # -- protocol hooks: keep the timestamps the controller predicts from -------------------------

    def start(self, t: float) -> Decision:
        decision = super().start(t)
        self._released_at[list(decision.release)] = t
        return decision

    def _decide_push(self, worker: int, t: float) -> Decision:
        self._interval[worker] = t - self._released_at[worker]
        decision = super()._decide_push(worker, t)
        self._released_at[list(decision.release)] = t
        return decision

    def _decide_leave(self, worker: int, t: float) -> Decision:
        decision = super()._decide_leave(worker, t)
        self._released_at[list(decision.release)] = t
        return decision

    # -- the model -----------------------------------------------------------------------------

    def _admit(self, worker: int, t: float, floor: int) -> bool:
        lead = int(self.done[worker]) - floor
        if lead <= self.staleness:
            self.threshold[worker] = self.staleness
            self._planned[worker] = False
            return True
        if self._planned[worker]:
            if lead <= self.threshold[worker]:
                return True
            # The planned hold: wait for the slowest (SSP with bound s_i); plan anew afterwards.
            self._planned[worker] = False
            return False
        extra = self._plan(worker, t, lead)
        self.threshold[worker] = lead - 1 + extra
        self._planned[worker] = extra > 0
        return extra > 0

    def _bound(self, worker: int) -> int:
        return int(self.threshold[worker])

    def _plan(self, worker: int, t: float, lead: int) -> int:
        """The synchronization controller: extra iterations for ``worker``, past the lower bound at ``t``."""
        self.controller_calls += 1
        # A push can only be released with lead <= s + r, so the next push has lead <= s + r + 1.
        most = self.staleness + self.dssp_range + 1 - lead
        interval = self._predicted_interval(worker)
        slowest = self._predict_slowest_push()
        extra = 0
        if most > 0 and interval is not None and slowest is not None:
            # Worker's k-th next push lands at t + k * interval (k = 0: it is held now).
            distance = [abs(t + k * interval - slowest) for k in range(most + 1)]
            extra = int(np.argmin(distance))  # argmin returns the first minimum: ties -> smaller k
        self.last_plan = DSSPPlan(worker, t, lead, extra, lead - 1 + extra, interval, slowest)
        return extra

    def _predicted_interval(self, worker: int) -> float | None:
        if self.done[worker] < MIN_HISTORY or not np.isfinite(self._interval[worker]):
            return None
        return float(self._interval[worker])

    def _predict_slowest_push(self) -> float | None:
        """When the minimum over active workers rises: the latest next push of those at the minimum."""
        floor = self.min_done()
        slowest = self.active_index[self.done[self.active_index] == floor]
        if floor < MIN_HISTORY or not len(slowest):
            return None
        next_push = self._released_at[slowest] + self._interval[slowest]
        if not np.all(np.isfinite(next_push)):
            return None
        return float(next_push.max())
