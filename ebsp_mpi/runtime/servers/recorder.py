"""What rank 0 records of a run, apart from its message loop: the evaluations (one slice at a time,
between messages), the checkpoints, the per-worker totals the pushes' headers carry, progress, and at
the end the summary.

The loop tells it what happened (a push taken in, the time) and hands it the whole model when it asks
(gathered from every shard); it decides nothing about the run. The files it writes, and when, are
those of the reference trainer (``run_record.RunRecord``).
"""

from __future__ import annotations

import logging

import numpy as np

from ...checkpoint import LAST_LOSS, TOTALS, Checkpoint
from ...outputs import build_summary
from ...progress import Progress
from ...run_record import RunRecord
from ..rank.trace_file import mpi_library
from ..transport.protocol import PUSH
from .evaluator import Evaluator

log = logging.getLogger(__name__)


class Recorder:
    """Rank 0's record of a run.

    Parameters
    ----------
    ctx : Context
    description : RunDescription
    run_dir : Path
    trace : RankTrace
        Rank 0's trace (the ``evals`` table).
    limits : list of (int or None)
        Each worker's iterations, for the progress bar.
    show_progress : bool
    resumed : Checkpoint, optional
    """

    def __init__(self, ctx, description, run_dir, trace, limits, show_progress: bool = True,
                 resumed: Checkpoint | None = None):
        n, ds = ctx.workers, description.dataset
        self.ctx, self.job, self.trace = ctx, description.job, trace
        self.record = RunRecord(description, run_dir, resumed)
        self.evaluator = Evaluator(description.model(), ds.x_test, ds.y_test, self.job.eval.batch_size)
        self.last_loss = np.full(n, np.nan)
        # per worker, seconds of compute, waiting and injected delay of its pushes taken in (from their
        # headers), for checkpoints; and what a resumed run had done before this process started
        self.totals = {name: np.zeros(n) for name in TOTALS}
        self.resumed_totals = {name: np.zeros(n) for name in TOTALS}
        self.pending: tuple | None = None  # (t, version, pushes, seconds to write) of a checkpoint not committed
        if resumed is not None:
            for name in TOTALS:
                self.totals[name][...] = resumed.totals[name]
                self.resumed_totals[name][...] = resumed.totals[name]
            self.last_loss[...] = resumed.totals[LAST_LOSS]
        total = sum(limits) if all(lim is not None for lim in limits) else None
        # pushes summed over the workers; a resumed run's rate counts those since it resumed
        self.progress = Progress(total, unit="pushes", enabled=show_progress, counts=f"summed over {n} workers",
                                 start=int(sum(resumed.iterations)) if resumed is not None else 0,
                                 samples_per_unit=self.job.data.batch_size, stop_seconds=self.job.stop.seconds,
                                 clock_start=resumed.run_seconds if resumed is not None else 0.0)
        self.num_train = ds.num_train

    def pushed(self, w: int, head: np.ndarray) -> None:
        """Worker `w`'s push, with header `head`, is taken in."""
        for name in TOTALS:
            self.totals[name][w] += head[getattr(PUSH, name)]
        self.last_loss[w] = head[PUSH.loss]

    # -- evaluation -----------------------------------------------------------------------------

    def evaluate_slice(self) -> bool:
        """Evaluate the next slice of the model under evaluation; True when one was."""
        if not self.evaluator.active:
            return False
        result = self.evaluator.step()
        if result is not None:
            self._evaluated(*result)
        return True

    def maybe_start_eval(self, now: float, version: int, whole_model) -> None:
        """Start evaluating `whole_model()` (the model as of `version`) when an evaluation is due and
        none is under way."""
        if not self.evaluator.active and self.record.eval_due(now):
            self.evaluator.start(whole_model(), version, now)

    def evaluate_now(self, params: np.ndarray, t: float, version: int) -> tuple[float, float]:
        """Evaluate `params` in full (the end of the run): ``(loss, accuracy)``."""
        loss, acc = self.evaluator.evaluate_now(params)
        self._evaluated(t, version, loss, acc, self.ctx.now() - t)
        return loss, acc

    def _evaluated(self, t: float, version: int, loss: float, acc: float, seconds: float) -> None:
        self.trace.append("evals", t=t, version=version, test_loss=loss, test_acc=acc, seconds=seconds)
        self.record.evaluated(t, version, loss, acc)

    # -- checkpoints ----------------------------------------------------------------------------

    def checkpoint(self, t: float, params: np.ndarray, velocity: np.ndarray, coordinator, policy) -> None:
        """Write the run's state at run time `t` as the pending checkpoint (``checkpoint.pending.h5``):
        the whole model `params` and optimizer state `velocity`, the coordinator's counts and the
        policy's state. :meth:`commit_checkpoint` makes it the run's once the workers' traces hold what
        it counts."""
        c0 = self.ctx.now()
        # the trace first: a kill after the commit must not leave pushes the checkpoint counts out of it
        self.trace.flush()
        self.record.checkpoint(t, params=params, velocity=velocity, version=coordinator.version,
                               iterations=np.array(coordinator.pushes),
                               totals={**self.totals, LAST_LOSS: self.last_loss}, rejected=coordinator.rejected,
                               policy=policy.state_dict(), pending=True)
        self.pending = (t, coordinator.version, sum(coordinator.pushes), self.ctx.now() - c0)

    def commit_checkpoint(self) -> None:
        """The pending checkpoint becomes ``checkpoint.h5``, the one a resume reads."""
        self.record.commit_checkpoint()
        t, version, pushes, seconds = self.pending
        log.info("checkpoint at %.1f s: version %d, %d pushes, written in %.2f s, committed %.2f s later", t,
                 version, pushes, seconds, self.ctx.now() - t)
        self.pending = None

    # -- progress and the end -------------------------------------------------------------------

    def show_progress(self, coordinator) -> None:
        heard = self.last_loss[~np.isnan(self.last_loss)]
        pushes = sum(coordinator.pushes)
        self.progress.update(pushes, epoch=round(pushes * self.job.data.batch_size / self.num_train, 2),
                             loss=float(heard.mean()) if heard.size else None,
                             test_acc=self.record.last_eval[1], version=coordinator.version)

    def summary(self, wall: float, coordinator, policy, stats: list[dict], **rank_figures) -> dict:
        """The run's summary (``outputs.build_summary``), from the workers' statistics `stats` and what
        this rank recorded; `rank_figures`: ``hybrid``, ``byte_counts``, ``osdp``."""
        version, pushes = coordinator.version, list(coordinator.pushes)
        loss, acc = self.record.evals[-1][2:] if self.record.evals else (None, None)
        self.progress.close(sum(pushes), test_acc=acc, version=version)
        heard = self.last_loss[np.isfinite(self.last_loss)]
        return build_summary(
            self.job, sync=policy.name, world_size=self.ctx.size,
            backend=stats[0]["backend"] if stats else "numpy", wall_seconds=wall, iterations=pushes,
            wait_seconds=self._whole_run(stats, "wait_seconds", "wait_s"),
            compute_seconds=self._whole_run(stats, "compute_seconds", "compute_s"),
            injected_delay_seconds=self._whole_run(stats, "injected_delay_seconds", "injected_delay_s"),
            barriers=policy.barriers, rejected_pushes=coordinator.rejected, versions=version,
            train_loss=float(heard.mean()) if heard.size else None, test_loss=loss, test_accuracy=acc,
            targets=self.record.targets, evals=self.record.evals, mpi_library=mpi_library(),
            divergence=self.record.divergence.finding, **rank_figures)

    def _whole_run(self, stats: list[dict], key: str, total: str) -> list[float]:
        """Per worker, `key` of its statistics plus what the run had done before a resume."""
        return [s[key] + float(self.resumed_totals[total][w]) for w, s in enumerate(stats)]
