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

Trace rows (``take_records``): ``zipline`` (t, n, R, seconds — wall time of the ZipLine call measured
with ``clock``), ``barriers`` (one per released barrier) and ``barrier_members`` (one per worker of it;
``arrival_t`` is NaN for a worker that left before arriving).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from .base import NOTHING, Decision, SyncPolicy
from .predictor import PushPredictor
from .zipline import zipline


@dataclass
class _Barrier:
    """A barrier decided by ZipLine and not yet released."""

    id: int
    t_decided: float
    predicted_spread: float
    predicted_time: float
    target: dict[int, int]          # worker -> value of done[worker] at which it is held
    r: dict[int, int]               # worker -> r_i, pushes after the decision
    predicted_t: dict[int, float]   # worker -> predicted time of its barrier push
    arrival: dict[int, float] = field(default_factory=dict)
    missing: int = 0                # active members that have not arrived yet


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
    """

    name = "elasticbsp"
    round_based = False

    def __init__(self, workers: int, lookahead: int = 15, penalty: float = 0.0,
                 predictor: str = "last", ema_alpha: float = 0.5, min_pushes: int = 2,
                 clock: Callable[[], float] = time.perf_counter):
        super().__init__(workers)
        if int(lookahead) != lookahead or lookahead < 1:
            raise ValueError(f"ElasticBSP lookahead must be an integer >= 1, got {lookahead}")
        if not (math.isfinite(penalty) and penalty >= 0):
            raise ValueError(f"ElasticBSP penalty must be finite and >= 0, got {penalty}")
        if int(min_pushes) != min_pushes or min_pushes < 2:
            raise ValueError(f"ElasticBSP min_pushes must be an integer >= 2, got {min_pushes}")
        self.lookahead = int(lookahead)
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

    # -- the protocol ----------------------------------------------------------------------------

    def _decide_push(self, worker: int, t: float) -> Decision:
        self.predictor.observe(worker, t)
        if self.predictor.pushes(worker) == self.min_pushes:
            self._ready += 1
        barrier = self._barrier
        if barrier is not None:
            target = barrier.target.get(worker)
            if target is not None and self._done[worker] >= target and worker not in barrier.arrival:
                barrier.arrival[worker] = t
                barrier.missing -= 1
                return self._release_if_complete(t)
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
        M = self.predictor.predict(members, self.lookahead)
        started = self._clock()
        result = zipline(M, penalty=self.penalty, now=t)
        seconds = self._clock() - started
        self._record("zipline", t=t, n=len(members), R=self.lookahead, seconds=seconds)
        r = {w: int(result.index[i]) + 1 for i, w in enumerate(members)}
        self._barrier = _Barrier(
            id=self._decided,
            t_decided=t,
            predicted_spread=result.spread,
            predicted_time=result.barrier_time,
            target={w: self._done[w] + r[w] for w in members},
            r=r,
            predicted_t={w: float(M[i, result.index[i]]) for i, w in enumerate(members)},
            missing=len(members),
        )
        self._decided += 1

    def _release_if_complete(self, t: float) -> Decision:
        barrier = self._barrier
        if barrier.missing:
            return NOTHING
        members = [w for w in barrier.target if w in self.active]
        self._barrier = None
        self.predictor.reset()
        self._ready = 0
        if not members:  # everyone left: the barrier never happens
            return NOTHING
        self._record_barrier(barrier, t)
        self.barriers += 1
        return Decision(release=tuple(sorted(members)))

    def _record_barrier(self, barrier: _Barrier, t: float) -> None:
        arrivals = list(barrier.arrival.values())
        observed = max(arrivals) - min(arrivals) if arrivals else math.nan
        self._record("barriers", barrier=barrier.id, t_decided=barrier.t_decided, t_released=t,
                     predicted_spread=barrier.predicted_spread, observed_spread=observed,
                     predicted_time=barrier.predicted_time)
        for w in sorted(barrier.target):
            self._record("barrier_members", barrier=barrier.id, worker=w, r=barrier.r[w],
                         predicted_t=barrier.predicted_t[w],
                         arrival_t=barrier.arrival.get(w, math.nan))
