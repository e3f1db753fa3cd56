"""ElasticBSP: barriers placed by ZipLine where the predicted wait is least (Zhao et al., ICDM 2019).

A superstep has two phases:

1. *Monitoring* — pushes are applied on arrival and pulls answered at once (as in ASP), while the
   :class:`~ebsp_mpi.sync.predictor.PushPredictor` records push times. It lasts until every active
   worker has pushed ``min_pushes`` times since the last barrier (so each has an interval measured
   after the barrier). A fast worker that gets there early simply keeps going.
2. *Barrier set* — at that moment (the decision time ``t_d``) the policy predicts each active worker's
   next R pushes, anchored at its latest push, and runs :func:`~ebsp_mpi.sync.zipline.zipline` on the
   n×R matrix (``now = t_d``). Worker i's barrier is its ``r_i = index[i] + 1``-th push after ``t_d``
   (counted from the decision, whatever it pushed during monitoring). Until then its pushes are
   applied and answered at once; at its barrier its pull is held. When every active member is held,
   all are released together — the server answers their pulls after the last push was applied, so
   they start the next superstep from the same weights — and monitoring starts again.

Consequences, relied on by the tests:

- no worker pushes more than ``r_i <= R`` times after a decision before it is held, so staleness
  inside a superstep is bounded by the monitoring phase plus R;
- a worker slower than predicted only delays the release: the others stay held until it arrives (it is
  never held itself before its barrier, so nothing deadlocks);
- n = 1: the lone worker's barrier releases it on arrival (no waiting);
- R = 1: every barrier is each worker's first push after the decision — a BSP-like barrier whose
  pushes were applied on arrival — after ``min_pushes`` monitored pushes;
- a worker that leaves is dropped from the barrier; if all remaining members are held, they go; a
  barrier whose members all left is dropped (neither counted nor recorded).

Under uncertainty (``zipline_z``, docs/design.md "ZipLine under uncertainty"): every push a member
makes between a decision and its barrier shows the error of the prediction for that k; the errors feed
a :class:`~ebsp_mpi.sync.prediction_error.PredictionErrorModel` when the barrier is released (whatever
z is, so the traces show σ also for the paper's ZipLine). With z > 0 the decision runs
:func:`~ebsp_mpi.sync.zipline.zipline_robust` on the intervals ``M ± z·σ``; with ``"auto"``,
:class:`~ebsp_mpi.sync.auto_z.AutoZ` raises z while the observed spreads (the waiting) exceed the
interval spreads. z = 0 runs
:func:`~ebsp_mpi.sync.zipline.zipline` itself: the paper's ZipLine, unchanged.

Re-planned barriers (``replan="overdue"``, :mod:`~ebsp_mpi.sync.replan`): while members are held, a
member's push that shows the barrier will cost them more waiting than it promised may move the barrier
(ZipLine again over what is left of R since the decision); the held members are released at once.
The barrier keeps its id and decision time, and R still counts from the decision, so the bound above
holds however often it moves.

Trace rows (``take_records``): ``zipline`` (t, n, R, seconds — wall time of the ZipLine call measured
with ``clock``), ``barriers`` (one per released barrier: predicted point and interval spread, observed
spread, the z and the mean σ of the chosen entries) and ``barrier_members`` (one per worker of it, with
the σ of its chosen entry; ``arrival_t`` is NaN for a worker that left before arriving).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from .auto_z import AutoZ
from .base import NOTHING, Decision, SyncPolicy
from .prediction_error import PredictionErrorModel
from .predictor import PushPredictor
from .replan import (REPLAN, barrier_turned_wrong, late_pace, projected_arrival, replan_lookahead,
                     replan_matrix, worth_replanning)
from .zipline import zipline, zipline_robust

#: what a decision does with a worker whose predicted next push lies before the decision time
OVERDUE = ("none", "widen")


@dataclass
class _Barrier:
    """A barrier decided by ZipLine and not yet released."""

    id: int
    t_decided: float
    predicted_spread: float
    predicted_time: float
    target: dict[int, int]          # worker -> value of done[worker] at which it is held
    r: dict[int, int]               # worker -> r_i, pushes after the decision (after the re-plan, if any)
    decided: dict[int, int]         # worker -> done[worker] at the decision (a re-plan keeps it: R counts from it)
    predicted_t: dict[int, float]   # worker -> predicted time of its barrier push
    M: np.ndarray                   # the predictions, one row per member in ``row`` order
    row: dict[int, int]             # worker -> its row of M
    sigma: dict[int, float]         # worker -> σ of its chosen entry
    z: float
    interval_spread: float          # max(M + zσ) − min(M − zσ) over the chosen entries
    arrival: dict[int, float] = field(default_factory=dict)
    first_arrival: float = math.inf
    # the waiting the last re-plan that was not taken promised: another is tried only for more
    declined: float = 0.0
    missing: int = 0                # active members that have not arrived yet
    # each push a member made after the decision, as (row, k, t): the errors of the predictions
    seen_row: list[int] = field(default_factory=list)
    seen_k: list[int] = field(default_factory=list)
    seen_t: list[float] = field(default_factory=list)


class ElasticBSP(SyncPolicy):
    """Elastic bulk synchronous parallel with ZipLine (ICDM 2019; tunable form: ML 2021).

    Parameters
    ----------
    workers : int
        Number of workers.
    lookahead : int
        R, the number of predicted next pushes per worker ZipLine may choose from (iterations).
    penalty : float
        λ >= 0 of the tunable ZipLine: minimise spread + λ·(barrier time − decision time).
    predictor : {"last", "ema"}
        Interval rule of :class:`~ebsp_mpi.sync.predictor.PushPredictor`.
    ema_alpha : float
        EMA weight for ``predictor="ema"``.
    min_pushes : int
        Pushes every worker makes after a barrier before the next one is decided (>= 2: an interval
        needs two pushes).
    clock : callable
        Returns seconds; times the ZipLine call for the ``zipline`` trace table.
    zipline_z : float or "auto"
        z >= 0: barriers chosen on the intervals ``M ± z·σ`` (0: the paper's ZipLine); ``"auto"``: z
        chosen online (:class:`~ebsp_mpi.sync.auto_z.AutoZ`).
    overdue : {"none", "widen"}
        ``"widen"``: a worker overdue at the decision (its predicted next push already in the past) is
        predicted with the time since its latest push as its interval
        (:meth:`~ebsp_mpi.sync.predictor.PushPredictor.predict`, ``now``); ``"none"``: the paper's.
    replan : {"none", "overdue"}
        ``"overdue"``: a member's push that shows the held members will wait longer than the barrier
        promised may move the barrier (:mod:`~ebsp_mpi.sync.replan`); ``"none"``: the paper's.
    """

    name = "elasticbsp"
    round_based = False

    def __init__(self, workers: int, lookahead: int = 15, penalty: float = 0.0,
                 predictor: str = "last", ema_alpha: float = 0.5, min_pushes: int = 2,
                 clock: Callable[[], float] = time.perf_counter, zipline_z: float | str = 0.0,
                 overdue: str = "none", replan: str = "none"):
        super().__init__(workers)
        if int(lookahead) != lookahead or lookahead < 1:
            raise ValueError(f"ElasticBSP lookahead must be an integer >= 1, got {lookahead}")
        if not (math.isfinite(penalty) and penalty >= 0):
            raise ValueError(f"ElasticBSP penalty must be finite and >= 0, got {penalty}")
        if int(min_pushes) != min_pushes or min_pushes < 2:
            raise ValueError(f"ElasticBSP min_pushes must be an integer >= 2, got {min_pushes}")
        self._auto = None
        if zipline_z == "auto":
            self._auto = AutoZ()
        elif isinstance(zipline_z, str) or not (math.isfinite(zipline_z) and zipline_z >= 0):
            raise ValueError(f"ElasticBSP zipline_z must be a finite number >= 0 or 'auto', got {zipline_z!r}")
        self.zipline_z = zipline_z
        if overdue not in OVERDUE:
            raise ValueError(f"ElasticBSP overdue must be one of {OVERDUE}, got {overdue!r}")
        self.overdue = overdue
        if replan not in REPLAN:
            raise ValueError(f"ElasticBSP replan must be one of {REPLAN}, got {replan!r}")
        self.replan = replan
        #: barriers moved by a re-plan so far
        self.replans = 0
        self.lookahead = int(lookahead)
        self.errors = PredictionErrorModel(workers, self.lookahead)
        self.penalty = float(penalty)
        self.min_pushes = int(min_pushes)
        self.predictor = PushPredictor(workers, rule=predictor, ema_alpha=ema_alpha)
        self._clock = clock
        self._decided = 0
        self._barrier: _Barrier | None = None
        # active workers that pushed min_pushes times since the last barrier: monitoring is complete
        # when that is all of them (a count, not a scan of every worker at each push)
        self._ready = 0

    # -- state the server and tests may look at ------------------------------------------------

    @property
    def phase(self) -> str:
        """``"monitor"`` (no barrier set) or ``"barrier"`` (a barrier is set and not yet released)."""
        return "monitor" if self._barrier is None else "barrier"

    @property
    def targets(self) -> dict[int, int]:
        """Per active member of the current barrier, the push count ``done`` at which it is held."""
        if self._barrier is None:
            return {}
        return {w: d for w, d in self._barrier.target.items() if w in self.active}

    @property
    def z(self) -> float:
        """The z of the next decision (``zipline_z``, or AutoZ's current choice)."""
        return self._auto.z if self._auto is not None else float(self.zipline_z)

    # -- the protocol ----------------------------------------------------------------------------

    def _decide_push(self, worker: int, t: float) -> Decision:
        self.predictor.observe(worker, t)
        if self.predictor.pushes(worker) == self.min_pushes:
            self._ready += 1
        barrier = self._barrier
        if barrier is not None:
            target = barrier.target.get(worker)
            if target is not None and worker not in barrier.arrival:
                r = barrier.r[worker]
                barrier.seen_row.append(barrier.row[worker])
                barrier.seen_k.append(self._done[worker] - target + r)
                barrier.seen_t.append(t)
                if self._done[worker] >= target:
                    barrier.arrival[worker] = t
                    barrier.first_arrival = min(barrier.first_arrival, t)
                    barrier.missing -= 1
                    return self._release_if_complete(t)
                if barrier.arrival and self.replan != "none":
                    return self._replan_if_wrong(barrier, worker, t)
            return self._alone[worker]
        if self._monitoring_complete():
            self._decide(t)  # the pusher's barrier lies r >= 1 pushes ahead: it goes on now
        return self._alone[worker]

    def _decide_leave(self, worker: int, t: float) -> Decision:
        if self.predictor.pushes(worker) >= self.min_pushes:
            self._ready -= 1
        barrier = self._barrier
        if barrier is not None:
            if worker in barrier.target and worker not in barrier.arrival:
                barrier.missing -= 1
            return self._release_if_complete(t)
        if self.active and self._monitoring_complete():
            self._decide(t)
        return NOTHING

    def load_state_dict(self, state: dict) -> None:
        super().load_state_dict(state)
        self._ready = 0  # the predictor starts afresh: monitoring, as after a barrier

    # -- the two phases --------------------------------------------------------------------------

    def _monitoring_complete(self) -> bool:
        # with min_pushes >= 2 a worker counted in _ready has an interval measured since the barrier
        return self._ready == len(self.active)

    def _decide(self, t: float) -> None:
        """Predict, run ZipLine and set each active worker's barrier (ICDM 2019, Alg. 1)."""
        members = sorted(self.active)
        M = self.predictor.predict(members, self.lookahead, now=t if self.overdue == "widen" else None)
        self._set_barrier(members, M, *self._zipline(members, M, t), t, {w: self._done[w] for w in members})
        self._decided += 1

    def _zipline(self, members: list[int], M: np.ndarray, t: float):
        """ZipLine (robust at z > 0) on `M`, `members`' rows, timed into the ``zipline`` table: the
        result, its interval spread, the σ it used and z."""
        n, R = M.shape
        z = self.z
        sigma = self.errors.sigma(members, R)
        started = self._clock()
        if z == 0.0:
            result = zipline(M, penalty=self.penalty, now=t)
            interval_spread = result.spread
        else:
            result = zipline_robust(M, sigma, z, penalty=self.penalty, now=t)
            interval_spread = result.interval_spread
        seconds = self._clock() - started
        self._record("zipline", t=t, n=n, R=R, seconds=seconds)
        return result, interval_spread, sigma, z

    def _set_barrier(self, members: list[int], M: np.ndarray, result, interval_spread: float,
                     sigma: np.ndarray, z: float, t: float, decided: dict[int, int]) -> None:
        """The barrier ZipLine chose on `M` at `t`; `decided`: the members' pushes at the decision, from
        which R counts (a re-plan keeps the barrier's id, decision time and counts)."""
        # whole columns to lists first: a NumPy element read one at a time costs more than the dicts
        rows = np.arange(len(members))
        index, done = result.index, self._done
        r = dict(zip(members, (index + 1).tolist(), strict=True))
        first = self._barrier is None
        self._barrier = _Barrier(
            id=self._decided if first else self._barrier.id,
            t_decided=t if first else self._barrier.t_decided,
            predicted_spread=result.spread,
            predicted_time=result.barrier_time,
            target={w: done[w] + r[w] for w in members},
            r=r,
            decided=decided,
            predicted_t=dict(zip(members, M[rows, index].tolist(), strict=True)),
            M=M,
            row=dict(zip(members, rows.tolist(), strict=True)),
            sigma=dict(zip(members, sigma[rows, index].tolist(), strict=True)),
            z=z,
            interval_spread=interval_spread,
            missing=len(members),
        )

    def _replan_if_wrong(self, barrier: _Barrier, worker: int, t: float) -> Decision:
        """`worker` pushed at `t` before its barrier while members are held: if the barrier now costs
        them more waiting than it promised, run ZipLine again over what is left of the lookahead and
        take the new plan if it promises them less (:mod:`~ebsp_mpi.sync.replan`)."""
        predictor = self.predictor
        remaining = barrier.target[worker] - self._done[worker]
        late_rate = late_pace(predictor.interval(worker), predictor.latest_interval(worker))
        projected = projected_arrival(t, remaining, late_rate)
        if not barrier_turned_wrong(barrier.first_arrival, projected, barrier.interval_spread) \
                or projected - t <= barrier.declined:
            return self._alone[worker]
        members = list(self.active_sorted())  # the barrier's members still running
        done, decided = self._done, barrier.decided
        R = replan_lookahead(self.lookahead, np.array([done[w] - decided[w] for w in members]))
        if R < 1:
            return self._alone[worker]
        held = [w for w in members if w in barrier.arrival]
        row = {w: i for i, w in enumerate(members)}
        M = replan_matrix(predictor.predict(members, R, now=t), t, np.array([row[w] for w in held]),
                          np.array([predictor.interval(w) for w in held]), row[worker], late_rate)
        result, interval_spread, sigma, z = self._zipline(members, M, t)
        if not worth_replanning(projected, t, interval_spread):
            barrier.declined = interval_spread
            return self._alone[worker]
        self._learn_errors(barrier)
        for w in held:
            predictor.restart(w, t)
        self._set_barrier(members, M, result, interval_spread, sigma, z, t, barrier.decided)
        self.replans += 1
        return Decision(release=tuple(sorted(held + [worker])))

    def _release_if_complete(self, t: float) -> Decision:
        barrier = self._barrier
        if barrier.missing:
            return NOTHING
        members = [w for w in barrier.target if w in self.active]
        self._barrier = None
        self.predictor.reset()
        self._ready = 0
        self._learn_errors(barrier)
        if not members:  # everyone left: the barrier never happens
            return NOTHING
        observed = self._observed_spread(barrier)
        if self._auto is not None:
            self._auto.observe(observed, barrier.interval_spread)
        self._record_barrier(barrier, t, observed)
        self.barriers += 1
        return Decision(release=tuple(sorted(members)))

    def _learn_errors(self, barrier: _Barrier) -> None:
        """Every push since the decision against its prediction, into the error model at once."""
        if barrier.seen_t:
            row, k = np.array(barrier.seen_row), np.array(barrier.seen_k)
            members = np.array(sorted(barrier.row, key=barrier.row.get))
            self.errors.observe(members[row], k, np.array(barrier.seen_t) - barrier.M[row, k - 1])

    @staticmethod
    def _observed_spread(barrier: _Barrier) -> float:
        """Last minus first arrival: how long the first member waited (NaN when nobody arrived)."""
        arrivals = list(barrier.arrival.values())
        return max(arrivals) - min(arrivals) if arrivals else math.nan

    def _record_barrier(self, barrier: _Barrier, t: float, observed: float) -> None:
        self._record("barriers", barrier=barrier.id, t_decided=barrier.t_decided, t_released=t,
                     predicted_spread=barrier.predicted_spread, observed_spread=observed,
                     predicted_time=barrier.predicted_time, z=barrier.z,
                     predicted_interval_spread=barrier.interval_spread,
                     sigma_mean=sum(barrier.sigma.values()) / len(barrier.sigma))
        for w in sorted(barrier.target):
            # r counts from the decision, as R does, whether or not the barrier was re-planned
            self._record("barrier_members", barrier=barrier.id, worker=w, r=barrier.target[w] - barrier.decided[w],
                         predicted_t=barrier.predicted_t[w],
                         arrival_t=barrier.arrival.get(w, math.nan), sigma=barrier.sigma[w])
