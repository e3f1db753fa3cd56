"""Seeded straggler injection: how long a worker sleeps after each iteration's real compute.

Pure (no MPI, no arrays of weights): the worker loop asks :meth:`StragglerModel.delay` once per
iteration, and a discrete-event simulator can use the same model for thousands of workers. See
docs/design.md, "Stragglers".

The module imports NumPy only where the jitter is drawn, so that the job schema (``config``, standard
library only) validates a job's slow phases and per-worker factors with the same code that applies
them: :class:`SlowPhase` checks a phase, :class:`StragglerModel` checks it against the workers.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Sequence
from dataclasses import dataclass

#: Iterations whose jitter draws are generated together, from one generator keyed by
#: (seed, worker, block); the draw of one iteration thus depends only on (seed, worker, iteration).
_JITTER_BLOCK = 1024
#: The third key of a worker's spread factor: a jitter block number no run reaches.
_SPREAD_KEY = 2**40


@dataclass(frozen=True)
class SlowPhase:
    """A transient slow phase: worker ``worker`` is ``factor`` times slower for ``t1 <= t < t2``.

    Parameters
    ----------
    worker : int
        0-based worker index (MPI rank worker + ``runtime.servers``).
    t1, t2 : float
        Start (inclusive) and end (exclusive) in run seconds; ``t2`` may be ``inf``.
    factor : float
        Multiplier (> 0) of the worker's compute time during the phase.
    """

    worker: int
    t1: float
    t2: float
    factor: float

    def __post_init__(self):
        if not _is_int(self.worker) or self.worker < 0:
            raise ValueError(f"slow phase: worker must be an integer >= 0, got {self.worker!r}")
        if not self.t1 < self.t2:
            raise ValueError(f"slow phase: expected t1 < t2 (seconds), got t1={self.t1}, t2={self.t2}")
        if not (math.isfinite(self.factor) and self.factor > 0):
            raise ValueError(f"slow phase: factor must be a finite number > 0, got {self.factor}")


class StragglerModel:
    """Per-worker slowdown, log-normal jitter and slow phases, reproducible from a seed.

    For worker ``w``'s iteration ``i``, whose real compute took ``compute_s`` seconds and started at
    run time ``t``, the emulated compute time is::

        emulated = (compute_s + base_s) * slowdown[w] * phase_factor(w, t) * J(w, i)

    and the injected delay (seconds to sleep after the real compute) is
    ``max(0, emulated - compute_s)``, so a factor below 1 cannot make a worker faster than it is.

    - ``slowdown[w]``: constant factor of worker ``w`` (missing entries are 1.0), times
      ``spread ** U(w)`` with ``U(w)`` uniform in [0, 1) from a Philox generator keyed by
      ``(seed, w, 2**40)``: speeds spread log-uniformly over ``spread`` times, for any number of
      workers (1: no spread).
    - ``phase_factor(w, t)``: product of the factors of ``w``'s slow phases with ``t1 <= t < t2``
      (overlapping phases multiply; 1.0 outside all phases).
    - ``J(w, i) = exp(jitter_sigma * Z)``, ``Z`` standard normal: log-normal with median 1 (mean
      ``exp(jitter_sigma**2 / 2)``). ``Z`` is drawn from a Philox generator keyed by
      ``(seed, w, i // 1024)``, so it depends only on ``(seed, w, i)``: not on timing, on the
      order of calls, or on which process asks.
    - ``base_s``: seconds added to every iteration's compute before the factors, to emulate a
      heavier model on a small dataset.

    Parameters
    ----------
    workers : int
        Number of workers; ``worker`` arguments are 0-based worker indices.
    enabled : bool
        If False, :meth:`delay` is always 0 (parameters are still validated).
    slowdown : sequence of float
        Per-worker factors (> 0), at most ``workers`` of them.
    jitter_sigma : float
        Standard deviation (>= 0) of the log of the jitter factor; 0 disables jitter.
    phases : sequence of SlowPhase
    base_s : float
        Extra emulated compute per iteration, seconds (>= 0).
    spread : float
        Ratio (>= 1) of the slowest to the fastest spread factor.
    seed : int
        Non-negative seed of the jitter.
    """

    def __init__(
        self,
        workers: int,
        *,
        enabled: bool = True,
        slowdown: Sequence[float] = (),
        jitter_sigma: float = 0.0,
        phases: Sequence[SlowPhase] = (),
        base_s: float = 0.0,
        seed: int = 0,
        spread: float = 1.0,
    ):
        if not _is_int(workers) or workers < 1:
            raise ValueError(f"straggler: workers must be an integer >= 1, got {workers!r}")
        slowdown = [float(f) for f in slowdown]
        if len(slowdown) > workers:
            raise ValueError(
                f"straggler.slowdown has {len(slowdown)} entries {slowdown} but there are only "
                f"{workers} workers (expected at most one factor per worker)"
            )
        for w, f in enumerate(slowdown):
            if not (math.isfinite(f) and f > 0):
                raise ValueError(f"straggler.slowdown[{w}] = {f}: expected a finite factor > 0")
        if not (math.isfinite(jitter_sigma) and jitter_sigma >= 0):
            raise ValueError(f"straggler.jitter_sigma = {jitter_sigma}: expected a finite number >= 0")
        if not (math.isfinite(spread) and spread >= 1):
            raise ValueError(f"straggler.spread = {spread}: expected a finite ratio >= 1")
        if not (math.isfinite(base_s) and base_s >= 0):
            raise ValueError(f"straggler.base_s = {base_s}: expected a finite number of seconds >= 0")
        if not _is_int(seed) or seed < 0:
            raise ValueError(f"straggler.seed = {seed!r}: expected an integer >= 0")
        for k, phase in enumerate(phases):
            if not isinstance(phase, SlowPhase):
                raise TypeError(f"straggler.phases[{k}] = {phase!r}: expected a SlowPhase")
            if phase.worker >= workers:
                raise ValueError(
                    f"straggler.phases[{k}]: worker {phase.worker} out of range "
                    f"(expected 0 <= worker < {workers})"
                )

        self.workers = int(workers)
        self.enabled = bool(enabled)
        self.spread = float(spread)
        self.slowdown = tuple(f * self._spread_factor(w, int(seed))
                              for w, f in enumerate(slowdown + [1.0] * (workers - len(slowdown))))
        self.jitter_sigma = float(jitter_sigma)
        self.phases = tuple(phases)
        self.base_s = float(base_s)
        self.seed = int(seed)
        self._phases_of = [
            tuple((p.t1, p.t2, p.factor) for p in self.phases if p.worker == w) for w in range(workers)
        ]
        # worker -> (block number, standard normal draws of that block's iterations)
        self._normals: dict[int, tuple] = {}

    def _spread_factor(self, worker: int, seed: int) -> float:
        if self.spread == 1.0:
            return 1.0
        import numpy as np  # here, not at the top: see the module docstring

        key = np.random.SeedSequence([seed, worker, _SPREAD_KEY])
        return self.spread ** float(np.random.Generator(np.random.Philox(key)).random())

    def _check_worker(self, worker: int) -> None:
        if not 0 <= worker < self.workers:
            raise ValueError(f"worker {worker} out of range (expected 0 <= worker < {self.workers})")

    def phase_factor(self, worker: int, t: float) -> float:
        """Product of ``worker``'s slow-phase factors active at run time ``t`` (seconds)."""
        self._check_worker(worker)
        factor = 1.0
        for t1, t2, f in self._phases_of[worker]:
            if t1 <= t < t2:
                factor *= f
        return factor

    def jitter(self, worker: int, iteration: int) -> float:
        """The log-normal jitter factor ``J`` of ``worker``'s iteration ``iteration`` (median 1)."""
        self._check_worker(worker)
        if self.jitter_sigma == 0.0:
            return 1.0
        if iteration < 0:
            raise ValueError(f"iteration must be >= 0, got {iteration}")
        block, offset = divmod(int(iteration), _JITTER_BLOCK)
        cached = self._normals.get(worker)
        if cached is None or cached[0] != block:
            # One generator per block of iterations, keyed so any iteration's draw can be
            # recomputed alone: the worker loop asks in order, the simulator may not.
            import numpy as np  # here, not at the top: see the module docstring

            key = np.random.SeedSequence([self.seed, worker, block])
            normals = np.random.Generator(np.random.Philox(key)).standard_normal(_JITTER_BLOCK)
            cached = (block, normals)
            self._normals[worker] = cached
        return math.exp(self.jitter_sigma * float(cached[1][offset]))

    def emulated(self, worker: int, iteration: int, compute_s: float, t: float) -> float:
        """Emulated compute time (seconds) of the iteration; see the class docstring."""
        self._check_worker(worker)
        return (
            (compute_s + self.base_s)
            * self.slowdown[worker]
            * self.phase_factor(worker, t)
            * self.jitter(worker, iteration)
        )

    def delay(self, worker: int, iteration: int, compute_s: float, t: float) -> float:
        """Seconds ``worker`` sleeps after iteration ``iteration``'s real compute.

        Parameters
        ----------
        worker : int
            0-based worker index.
        iteration : int
            0-based iteration number of that worker.
        compute_s : float
            Seconds the real forward + backward took.
        t : float
            Run time (seconds on rank 0's clock) when the iteration started; selects slow phases.

        Returns
        -------
        float
            ``max(0, emulated - compute_s)``; 0 when the model is disabled.
        """
        if not self.enabled:
            return 0.0
        return max(0.0, self.emulated(worker, iteration, compute_s, t) - compute_s)

    def as_dict(self) -> dict:
        """The model's parameters as JSON-able data (for trace attributes)."""
        return {
            "workers": self.workers,
            "enabled": self.enabled,
            "slowdown": list(self.slowdown),
            "jitter_sigma": self.jitter_sigma,
            "phases": [
                {"worker": p.worker, "t1": p.t1, "t2": p.t2, "factor": p.factor} for p in self.phases
            ],
            "base_s": self.base_s,
            "spread": self.spread,
            "seed": self.seed,
        }

    def __repr__(self) -> str:
        params = ", ".join(f"{k}={v!r}" for k, v in self.as_dict().items())
        return f"StragglerModel({params})"


def straggler_model(straggler, workers: int, seed: int) -> StragglerModel:
    """The model a job's ``[straggler]`` section (``config.StragglerConfig``) describes for `workers`
    workers, with the job's `seed`; ValueError names what does not fit."""
    return StragglerModel(workers, enabled=straggler.enabled, slowdown=straggler.slowdown,
                          jitter_sigma=straggler.jitter_sigma, base_s=straggler.base_s, seed=seed,
                          spread=straggler.spread,
                          phases=[SlowPhase(**p) for p in straggler.phases])


def _is_int(x) -> bool:
    """An integer, NumPy's included, but not a bool."""
    return isinstance(x, numbers.Integral) and not isinstance(x, bool)
