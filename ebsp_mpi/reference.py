"""The single-process reference trainer (world size 1): no server, no MPI traffic.

With ``sync.workers = n`` each step draws the minibatches that n BSP workers would draw from their
shards, computes each one's gradient, averages them with the BSP server's own function
(:func:`ebsp_mpi.nn.average.round_mean`: summed in worker order, then scaled by 1/n) and applies one
optimizer step. It is the oracle that BSP over MPI must match (docs/design.md, "Synchronization models").
"""

from __future__ import annotations

import logging
import time
from pathlib import Path

import numpy as np

from .backend import resolve_backend
from .errors import UsageError
from .build import optimizer, schedule
from .checkpoint import LAST_LOSS, read_checkpoint
from .config import JobConfig, to_dict
from .nn.average import round_mean
from .outputs import build_summary
from .progress import Progress
from .run_description import OsdpPlan, RunDescription, describe
from .run_record import RunRecord
from .stop_signals import StopSignals

log = logging.getLogger(__name__)


def train(job: JobConfig, run_dir: Path, workers: int, show_progress: bool = True, resume: bool = False, *,
          plan: OsdpPlan | None, stop: StopSignals | None = None, identity=None) -> dict:
    """Train until a stop condition; write ``summary.json`` and ``model.h5`` into `run_dir`.

    Checkpoints go to ``run_dir/checkpoint.h5`` every ``checkpoint.every_seconds``, at the end, and on
    SIGTERM or SIGINT (Ctrl-C), which end the run there. With `resume`, the run continues from that
    checkpoint. `plan`: the job's OSDP plan as the command line read it
    (``run_description.read_osdp_plan``; None: the job names none). `stop`: where the signals are noted
    (its ``exit_code`` tells the caller which came). `identity`: what the run is made from
    (``ebsp_mpi.identity``), by default worked out here with a new run id.

    Returns
    -------
    dict
        The summary (also written to ``run_dir/summary.json``).
    """
    if identity is None:
        from . import identity as ids

        identity = ids.current(to_dict(job), run_id=ids.new_run_id())
    trainer = ReferenceTrainer(describe(job, workers, plan, identity), run_dir, resume)
    stop = (StopSignals() if stop is None else stop).install()
    try:
        # a resumed run's rate counts this process's steps; a step trains on every worker's batch
        progress = Progress(trainer.limit, enabled=show_progress, start=trainer.step,
                            samples_per_unit=job.data.batch_size * workers, stop_seconds=job.stop.seconds,
                            clock_start=trainer.resumed_at)
        wall = trainer.run(progress, stop)
    finally:
        stop.restore()
    if stop:
        log.warning("%s: stopped at step %d, after a checkpoint", stop.name, trainer.step)
    return trainer.finish(wall)


class ReferenceTrainer:
    """The model, its optimizer and n workers' batch streams in one process; BSP's rounds as steps."""

    def __init__(self, description: RunDescription, run_dir: Path, resume: bool):
        job, workers = description.job, description.workers
        self.job, self.workers, self.run_dir = job, workers, run_dir
        self.backend = backend = resolve_backend(job.backend)
        xp, ds = backend.xp, description.dataset
        self.ds, self.model = ds, description.model(xp=xp)
        self.space = space = self.model.space
        self.opt, self.lr_at = optimizer(job, space.size, xp=xp), schedule(job)
        self.streams = [description.batch_stream(w) for w in range(workers)]
        self.limit = description.limits[0]
        # one gradient per worker, as the server holds them; a single worker's is the model's own buffer
        self.grads = [space.grad] if workers == 1 else [xp.empty_like(space.grad) for _ in range(workers)]
        self.mean_buf = xp.empty_like(space.grad) if workers > 1 else None
        self.x_eval, self.y_eval = backend.asarray(ds.x_test), backend.asarray(ds.y_test)
        log.info("training %s on %s (%d train / %d test samples), %d parameters, %d worker(s), backend %s",
                 job.model.kind, ds.name, len(ds.y_train), len(ds.y_test), space.size, workers, backend.describe())
        self.step, self.loss = 0, float("nan")
        self.compute = np.zeros(workers)  # seconds of forward + backward per worker
        self.resumed_at = 0.0
        ckpt = read_checkpoint(run_dir) if resume else None
        if ckpt is not None:
            if ckpt.params.shape != space.data.shape:  # a dataset of other shapes, accepted as a mismatch
                raise UsageError(f"checkpoint of {ckpt.params.size} parameters; this job's model has {space.size}")
            space.data[...] = xp.asarray(ckpt.params)
            self.opt.velocity[...] = xp.asarray(ckpt.velocity)
            self.step, self.resumed_at = ckpt.version, ckpt.run_seconds
            self.loss = float(np.mean(ckpt.totals[LAST_LOSS]))
            self.compute[...] = ckpt.totals["compute_s"]
            for stream in self.streams:
                stream.seek(self.step)
            log.info("resumed from the checkpoint at %.1f s, step %d", self.resumed_at, self.step)
        self.record = RunRecord(description, run_dir, ckpt)

    def run(self, progress: Progress, terminate) -> float:
        """Take steps until a stop condition or `terminate` (true once a stop signal came); returns the
        run's seconds."""
        t0 = time.perf_counter() - self.resumed_at  # a resumed run's clock goes on from its checkpoint
        self.record.start(self.resumed_at)
        while not (terminate or self._should_stop(time.perf_counter() - t0)):
            self._take_step()
            elapsed = time.perf_counter() - t0
            if self.record.eval_due(elapsed):
                self._evaluate(elapsed)
            if self.record.checkpoint_due(elapsed):
                self._checkpoint(elapsed)
            progress.update(self.step, loss=self.loss, test_acc=self.record.last_eval[1], epoch=self._epoch())
        wall = time.perf_counter() - t0
        self._evaluate(wall)
        self._checkpoint(wall)  # the end, or where SIGTERM stopped it: a longer run can go on from here
        progress.close(self.step, loss=self.loss, test_acc=self.record.last_eval[1], epoch=self._epoch())
        return wall

    def _take_step(self) -> None:
        """One BSP round: each worker's gradient on its next batch, their mean as one optimizer step."""
        losses, ds, backend, space = [], self.ds, self.backend, self.space
        for w, stream in enumerate(self.streams):
            idx = stream.next_indices()
            c0 = time.perf_counter()
            losses.append(self.model.loss_and_grad(backend.asarray(ds.x_train[idx]), backend.asarray(ds.y_train[idx])))
            self.compute[w] += time.perf_counter() - c0
            if self.workers > 1:
                self.grads[w][...] = space.grad
        self.opt.step(space.data, round_mean(self.grads, self.mean_buf), self.lr_at(self.step))
        self.step += 1
        self.loss = float(np.mean(losses))

    def _should_stop(self, elapsed: float) -> bool:
        if self.limit is not None and self.step >= self.limit:
            return True
        return bool(self.job.stop.seconds) and elapsed >= self.job.stop.seconds

    def _epoch(self) -> float:
        return round(self.streams[0].epochs_done, 2)

    def _evaluate(self, t: float) -> None:
        loss, acc = self.model.evaluate(self.x_eval, self.y_eval, batch_size=self.job.eval.batch_size)
        self.record.evaluated(t, self.step, loss, acc)

    def _checkpoint(self, t: float) -> None:
        n, to_host = self.workers, self.backend.to_host
        self.record.checkpoint(
            t, params=to_host(self.space.data), velocity=to_host(self.opt.velocity), version=self.step,
            iterations=np.full(n, self.step),
            totals={"compute_s": self.compute, "wait_s": np.zeros(n), "injected_delay_s": np.zeros(n),
                    LAST_LOSS: np.full(n, self.loss)})

    def finish(self, wall: float) -> dict:
        """Write ``model.h5`` and ``summary.json``; returns the summary."""
        n, step = self.workers, self.step
        test_loss, test_acc = self.record.last_eval
        summary = build_summary(
            self.job, sync=self.job.sync.model if n > 1 else "single", world_size=1,
            backend=self.backend.describe(), wall_seconds=wall, iterations=[step] * n, wait_seconds=[0.0] * n,
            compute_seconds=self.compute.tolist(), injected_delay_seconds=None, barriers=step if n > 1 else 0,
            rejected_pushes=0, versions=step, train_loss=self.loss, test_loss=test_loss, test_accuracy=test_acc,
            targets=self.record.targets, evals=self.record.evals, mpi_library=None,
            divergence=self.record.divergence.finding)
        self.record.write_model(self.space.state_dict(), step, summary["sync"])
        self.record.write_summary(summary)
        return summary
