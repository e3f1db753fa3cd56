"""The single-process reference trainer (world size 1): no server, no MPI traffic.

With ``sync.workers = n`` each step draws the minibatches that n BSP workers would draw from their
shards, computes each one's gradient, averages them (summed in worker order, then scaled by 1/n —
the same arithmetic as the BSP server) and applies one optimizer step. It is the oracle that BSP over
MPI must match (DESIGN.md, "Synchronization models").
"""

from __future__ import annotations

import logging
import time
from pathlib import Path

import numpy as np

from . import __version__, build
from .backend import resolve_backend
from .config import JobConfig, to_dict
from .outputs import AccuracyTargets, write_model, write_summary
from .progress import Progress

log = logging.getLogger(__name__)


def train(job: JobConfig, run_dir: Path, workers: int, show_progress: bool = True) -> dict:
    """Train until a stop condition; write ``summary.json`` and ``model.h5`` into `run_dir`.

    Returns
    -------
    dict
        The summary (also written to ``run_dir/summary.json``).
    """
    backend = resolve_backend(job.backend)
    xp = backend.xp
    ds = build.dataset(job)
    model = build.model(job, ds, xp=xp)
    space = model.space
    opt = build.optimizer(job, space.size, xp=xp)
    lr_at = build.schedule(job)
    streams = [build.batch_stream(job, ds, w, workers) for w in range(workers)]
    limit = build.iteration_limit(job, streams[0].batches_per_epoch)
    grad_sum = xp.empty_like(space.grad) if workers > 1 else None
    x_eval, y_eval = backend.asarray(ds.x_test), backend.asarray(ds.y_test)
    targets = AccuracyTargets(list(job.eval.targets))
    log.info("training %s on %s (%d train / %d test samples), %d parameters, %d worker(s), backend %s",
             job.model.kind, ds.name, len(ds.y_train), len(ds.y_test), space.size, workers, backend.describe())

    progress = Progress(limit, enabled=show_progress)
    t0 = time.perf_counter()
    next_eval = job.eval.every_seconds
    step, loss, test_loss, test_acc, evals = 0, float("nan"), None, None, []
    while not _should_stop(job, step, limit, time.perf_counter() - t0):
        losses = []
        for w, stream in enumerate(streams):
            idx = stream.next_indices()
            losses.append(model.loss_and_grad(backend.asarray(ds.x_train[idx]), backend.asarray(ds.y_train[idx])))
            if grad_sum is not None:
                # sum in worker order, as the BSP server does, so the two agree bit for bit where the
                # per-worker gradients do
                if w == 0:
                    grad_sum[...] = space.grad
                else:
                    grad_sum += space.grad
        if grad_sum is not None:
            grad_sum *= np.float32(1.0 / workers)
        opt.step(space.data, space.grad if grad_sum is None else grad_sum, lr_at(step))
        step += 1
        loss = float(np.mean(losses))
        elapsed = time.perf_counter() - t0
        if elapsed >= next_eval:
            test_loss, test_acc = model.evaluate(x_eval, y_eval, batch_size=job.eval.batch_size)
            evals.append((elapsed, step, test_loss, test_acc))
            targets.observe(elapsed, test_acc)
            next_eval = elapsed + job.eval.every_seconds
        progress.update(step, loss=loss, test_acc=test_acc, epoch=round(streams[0].epochs_done, 2))
    wall = time.perf_counter() - t0

    test_loss, test_acc = model.evaluate(x_eval, y_eval, batch_size=job.eval.batch_size)
    targets.observe(wall, test_acc)
    evals.append((wall, step, test_loss, test_acc))
    progress.close(step, loss=loss, test_acc=test_acc, epoch=round(streams[0].epochs_done, 2))

    summary = {
        "name": job.name,
        "sync": job.sync.model if workers > 1 else "single",
        "workers": workers,
        "world_size": 1,
        "backend": backend.describe(),
        "wall_seconds": wall,
        "iterations": [step] * workers,
        "wait_seconds": [0.0] * workers,
        "barriers": step if workers > 1 else 0,
        "rejected_pushes": 0,
        "versions": step,
        "train_loss": loss,
        "test_loss": test_loss,
        "test_accuracy": test_acc,
        "samples_per_second": step * workers * job.data.batch_size / wall if wall > 0 else 0.0,
        "time_to_accuracy": targets.as_dict(),
        "evals": [{"t": t, "version": v, "test_loss": l, "test_acc": a} for t, v, l, a in evals],
        "package_version": __version__,
        "config": to_dict(job),
    }
    write_model(run_dir, space.state_dict(), version=step, step=step,
                attrs={"sync": summary["sync"], "config_json": to_dict(job)})
    write_summary(run_dir, summary)
    return summary


def _should_stop(job: JobConfig, step: int, limit: int | None, elapsed: float) -> bool:
    if limit is not None and step >= limit:
        return True
    return bool(job.stop.seconds) and elapsed >= job.stop.seconds
