"""What a trainer records of its run besides its traces: the evaluations and the accuracy targets,
the checkpoints (when one is due, and writing it), and at the end ``model.h5`` and ``summary.json``.

The single-process reference trainer and rank 0 of an MPI run both keep theirs here, so that the two
record the same things on the same schedule and write the same files.
"""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np

from .checkpoint import Checkpoint, commit_checkpoint, write_checkpoint
from .config import to_dict
from .divergence import DivergenceWatch
from .outputs import AccuracyTargets, identity_keys, write_model, write_summary

log = logging.getLogger(__name__)


class RunRecord:
    """The evaluations, checkpoints and outputs of one run.

    Parameters
    ----------
    description : RunDescription
        The run (its job, and its OSDP plan's digest, which every checkpoint holds).
    run_dir : Path
    resumed : Checkpoint, optional
        The checkpoint a resumed run continues from: its evaluations and targets reached go on.
    """

    def __init__(self, description, run_dir: Path, resumed: Checkpoint | None = None):
        self.job, self.run_dir = description.job, Path(run_dir)
        self.config = to_dict(self.job)
        self.plan_sha256 = description.plan_sha256  # the OSDP plan as the run started with it
        identity = description.identity
        self.identity = identity.as_dict() if identity is not None else None
        self.targets = AccuracyTargets(list(self.job.eval.targets))
        self.evals: list[tuple] = []  # (t, version, test loss, test accuracy) of every evaluation
        self.last_eval = (None, None)  # (test loss, test accuracy) of the latest evaluation
        self.divergence = DivergenceWatch.for_job(self.job, description.dataset.y_test)
        if resumed is not None:
            self.evals = [tuple(e) for e in resumed.evals]
            self.targets.reached.update(resumed.reached)
            for e in self.evals:  # a finding before the cut was warned of then
                self.divergence.observe(*e, quiet=True)
        self.next_eval = self.next_checkpoint = np.inf

    def start(self, t: float) -> None:
        """The run's clock starts (or, resumed, goes on) at run time `t`: the first evaluation and
        checkpoint are due an interval later."""
        every = self.job.checkpoint.every_seconds
        self.next_checkpoint = t + every if every else np.inf
        self.next_eval = t + self.job.eval.every_seconds

    def eval_due(self, t: float) -> bool:
        """Whether an evaluation is due at `t`; if so, the next is due an interval after `t`."""
        if t < self.next_eval:
            return False
        self.next_eval = t + self.job.eval.every_seconds
        return True

    def evaluated(self, t: float, version: int, loss: float, accuracy: float) -> None:
        """Model `version`, as of run time `t`, has this test loss and accuracy."""
        self.evals.append((t, version, loss, accuracy))
        self.targets.observe(t, accuracy)
        self.last_eval = (loss, accuracy)
        self.divergence.observe(t, version, loss, accuracy)

    def checkpoint_due(self, t: float) -> bool:
        return t >= self.next_checkpoint

    def checkpoint(self, t: float, *, params, velocity, version: int, iterations, totals: dict, rejected: int = 0,
                   policy: dict | None = None, pending: bool = False) -> None:
        """Write ``checkpoint.h5`` as of run time `t` (``ebsp_mpi.checkpoint``), or with `pending` the
        file that :meth:`commit_checkpoint` makes it; the next is due an interval later."""
        write_checkpoint(self.run_dir, Checkpoint(
            params=params, velocity=velocity, version=version, run_seconds=t, iterations=iterations, totals=totals,
            rejected=rejected, policy=policy or {}, evals=self.evals, reached=self.targets.reached,
            config=self.config, plan_sha256=self.plan_sha256, identity=self.identity), pending=pending)
        every = self.job.checkpoint.every_seconds
        self.next_checkpoint = t + every if every else np.inf

    def commit_checkpoint(self) -> None:
        """The pending checkpoint becomes the run's checkpoint."""
        commit_checkpoint(self.run_dir)

    def write_model(self, state_dict: dict, version: int, sync: str) -> None:
        """``model.h5``: the trained model at `version` (its optimizer step), trained under `sync`."""
        write_model(self.run_dir, state_dict, version=version, step=version,
                    attrs={"sync": sync, "config_json": self.config})

    def write_summary(self, summary: dict) -> None:
        """``summary.json``, with the run's identity (its id, and what it was made from)."""
        write_summary(self.run_dir, {**summary, **identity_keys(self.identity)})
