"""Divergence made visible: a run whose model stopped learning says so, once, while it runs.

Asynchronous models apply each push to weights that moved on since the worker pulled them: a push
``n`` versions stale, with momentum μ, lands on a velocity that already holds the ``n`` steps taken
since, and at a few dozen workers the default optimizer (lr 0.05, μ 0.9) blows up, then settles at
chance with dead units; the run exits 0 all the same. A :class:`DivergenceWatch` looks at every
evaluation and names the first sign it sees:

- ``chance``: the test accuracy stayed at chance for ``eval.divergence_evals`` evaluations in a row,
  each of new weights (an evaluation repeated between two steps does not count). At chance means
  within 5 % of the way from a constant guess (the share of the test set's most common class) to 1;
- ``loss``: the test loss grew ``eval.divergence_loss_factor`` times above the lowest seen so far,
  or is not a finite number.

Pure: no MPI, no I/O but one warning through ``logging``; the single-process trainer, the server and
the emulated trainer feed it, and ``summary.json`` records its finding (``divergence``, null when none).
"""

from __future__ import annotations

import logging
import math

import numpy as np

log = logging.getLogger(__name__)

#: "At chance": below this fraction of the way from a constant guess's accuracy to 1
CHANCE_MARGIN = 0.05


def chance_accuracy(y_test) -> float:
    """The accuracy of always guessing the most common class of `y_test`."""
    y = np.asarray(y_test)
    return float(np.bincount(y).max() / y.size) if y.size else 0.0


class DivergenceWatch:
    """Evaluations in, at most one finding out.

    Parameters
    ----------
    chance : float
        Accuracy of a constant guess (:func:`chance_accuracy` of the test labels).
    evals : int
        Evaluations of new weights in a row at chance that make a finding (0: never).
    loss_factor : float
        Growth of the test loss above its lowest that makes a finding (0: never).
    lr, momentum : float
        The optimizer's, for the message.
    """

    def __init__(self, chance: float, evals: int, loss_factor: float, lr: float, momentum: float):
        self.chance, self.evals, self.loss_factor = float(chance), int(evals), float(loss_factor)
        self.lr, self.momentum = float(lr), float(momentum)
        self.at_chance = self.chance + CHANCE_MARGIN * (1.0 - self.chance)
        self.best_loss = math.inf
        self.run: list[tuple[float, int]] = []  # (t, version) of the evaluations at chance in a row
        self.last_version: int | None = None
        self.staleness_sum = 0
        self.pushes = 0
        self.finding: dict | None = None

    @classmethod
    def for_job(cls, job, y_test) -> DivergenceWatch:
        e, o = job.eval, job.optim
        return cls(chance_accuracy(y_test), e.divergence_evals, e.divergence_loss_factor, o.lr, o.momentum)

    def push(self, staleness: int) -> None:
        """A push was applied `staleness` versions after the weights it was computed on."""
        self.staleness_sum += int(staleness)
        self.pushes += 1

    def observe(self, t: float, version: int, loss: float, accuracy: float, quiet: bool = False) -> None:
        """An evaluation of the weights of `version` at run time `t`; the first finding is logged as
        one warning (unless `quiet`: a resumed run replaying the evaluations it had made)."""
        if self.finding is not None:
            return
        seen = self._loss_seen(t, version, loss) or self._chance_seen(t, version, accuracy)
        if seen is None:
            return
        self.finding = {**seen, "t": float(t), "version": int(version), "test_loss": _finite(loss),
                        "test_accuracy": float(accuracy), "mean_staleness": self.mean_staleness,
                        "momentum": self.momentum, "lr": self.lr}
        self.finding["message"] = self.message()
        if not quiet:
            log.warning("%s", self.finding["message"])

    @property
    def mean_staleness(self) -> float | None:
        """Versions between a push's weights and the ones it was applied to, on average (None: no push)."""
        return self.staleness_sum / self.pushes if self.pushes else None

    def _loss_seen(self, t: float, version: int, loss: float) -> dict | None:
        if not math.isfinite(loss):
            return {"seen": "loss", "saw": f"the test loss is {loss} at {t:.3g} s (version {version})"}
        grown = self.loss_factor > 0 and loss > self.loss_factor * self.best_loss
        self.best_loss = min(self.best_loss, loss)
        if grown:
            return {"seen": "loss", "saw": f"the test loss grew to {loss:.4g} at {t:.3g} s (version {version}), "
                                           f"more than {self.loss_factor:g} x its best {self.best_loss:.4g}"}
        return None

    def _chance_seen(self, t: float, version: int, accuracy: float) -> dict | None:
        if version == self.last_version:  # the same weights again: no new evidence
            return None
        self.last_version = version
        if version == 0 or accuracy >= self.at_chance:
            self.run = []
            return None
        self.run.append((t, version))
        if self.evals <= 0 or len(self.run) < self.evals:
            return None
        (t0, v0) = self.run[0]
        return {"seen": "chance", "saw": f"test accuracy stayed at chance ({accuracy:.3f}, a constant guess "
                                         f"scores {self.chance:.3f}) for {len(self.run)} evaluations, "
                                         f"{t0:.3g}-{t:.3g} s (versions {v0}-{version})"}

    def message(self) -> str:
        """The warning: what was seen, the likely cause, the knobs."""
        staleness = self.mean_staleness
        if staleness is not None and staleness >= 1.0:
            cause = (f"pushes {staleness:.1f} versions stale on average with momentum {self.momentum:g}: each "
                     f"stale gradient lands on a velocity that already holds the steps since")
            knobs = f"set optim.staleness=scale (lr / staleness), or lower optim.lr (now {self.lr:g})"
        else:
            cause = f"learning rate {self.lr:g} with momentum {self.momentum:g} is too large for this model"
            knobs = f"lower optim.lr (now {self.lr:g}) or optim.momentum"
        return f"training diverged: {self.finding['saw']}; likely cause: {cause}; {knobs}"


def _finite(x: float) -> float | None:
    return float(x) if math.isfinite(x) else None
