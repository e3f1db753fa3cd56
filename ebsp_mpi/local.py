"""The single-process reference trainer (world size 1): no server, no MPI traffic.

With ``sync.workers = n`` each step draws the minibatches that n BSP workers would draw from their
shards, computes each one's gradient, averages them with the BSP server's own function
(:func:`ebsp_mpi.nn.average.round_mean`: summed in worker order, then scaled by 1/n) and applies one
optimizer step. It is the oracle that BSP over MPI must match (docs/design.md, "Synchronization models").
"""

from __future__ import annotations

import logging
import signal
import time
from pathlib import Path

import numpy as np

from . import build
from .backend import resolve_backend
from .checkpoint import Checkpoint, read_checkpoint, write_checkpoint
from .config import JobConfig, to_dict
from .nn.average import round_mean
from .outputs import AccuracyTargets, build_summary, write_model, write_summary
from .progress import Progress
from .run_description import describe, read_osdp_plan

log = logging.getLogger(__name__)


def train(job: JobConfig, run_dir: Path, workers: int, show_progress: bool = True, resume: bool = False,
          plan=build.FROM_JOB) -> dict:
    """Train until a stop condition; write ``summary.json`` and ``model.h5`` into `run_dir`.

    Checkpoints go to ``run_dir/checkpoint.h5`` every ``checkpoint.every_seconds``, at the end, and on
    SIGTERM (which ends the run there). With `resume`, the run continues from that checkpoint. `plan`:
    the job's OSDP plan as the command line read it (``run_description.read_osdp_plan``), by default
    read here.

    Returns
    -------
    dict
        The summary (also written to ``run_dir/summary.json``).
    """
    if plan is build.FROM_JOB:
        plan = read_osdp_plan(job)
    description = describe(job, workers, plan)
    backend = resolve_backend(job.backend)
    xp = backend.xp
    ds = description.dataset
    model = description.model(xp=xp)
    space = model.space
    opt = build.optimizer(job, space.size, xp=xp)
    lr_at = build.schedule(job)
    streams = [description.batch_stream(w) for w in range(workers)]
    limit = description.limits[0]
    # one gradient per worker, as the server holds them; a single worker's is the model's own buffer
    grads = [space.grad] if workers == 1 else [xp.empty_like(space.grad) for _ in range(workers)]
    mean_buf = xp.empty_like(space.grad) if workers > 1 else None
    x_eval, y_eval = backend.asarray(ds.x_test), backend.asarray(ds.y_test)
    targets = AccuracyTargets(list(job.eval.targets))
    log.info("training %s on %s (%d train / %d test samples), %d parameters, %d worker(s), backend %s",
             job.model.kind, ds.name, len(ds.y_train), len(ds.y_test), space.size, workers, backend.describe())

    step, loss, test_acc, evals = 0, float("nan"), None, []
    compute = np.zeros(workers)  # seconds of forward + backward per worker
    resumed_at = 0.0
    if resume:
        ckpt = read_checkpoint(run_dir)
        space.data[...] = xp.asarray(ckpt.params)
        opt.velocity[...] = xp.asarray(ckpt.velocity)
        step, resumed_at, evals = ckpt.version, ckpt.run_seconds, list(ckpt.evals)
        loss = float(np.mean(ckpt.totals["last_loss"]))
        compute[...] = ckpt.totals["compute_s"]
        targets.reached.update(ckpt.reached)
        for stream in streams:
            stream.seek(step)
        log.info("resumed from the checkpoint at %.1f s, step %d", resumed_at, step)

    plan_sha256 = description.plan_sha256  # the OSDP plan as the run started with it

    def checkpoint(t: float) -> None:
        write_checkpoint(run_dir, Checkpoint(
            params=backend.to_host(space.data), velocity=backend.to_host(opt.velocity), version=step, run_seconds=t,
            iterations=np.full(workers, step),
            totals={"compute_s": compute, "wait_s": np.zeros(workers), "injected_delay_s": np.zeros(workers),
                    "last_loss": np.full(workers, loss)},
            evals=evals, reached=targets.reached, config=to_dict(job), plan_sha256=plan_sha256))

    terminate = []
    previous_handler = signal.signal(signal.SIGTERM, lambda signum, frame: terminate.append(True))
    progress = Progress(limit, enabled=show_progress)
    t0 = time.perf_counter() - resumed_at  # a resumed run's clock goes on from its checkpoint
    next_eval = resumed_at + job.eval.every_seconds
    every = job.checkpoint.every_seconds
    next_checkpoint = resumed_at + every if every else np.inf
    while not (terminate or _should_stop(job, step, limit, time.perf_counter() - t0)):
        losses = []
        for w, stream in enumerate(streams):
            idx = stream.next_indices()
            c0 = time.perf_counter()
            losses.append(model.loss_and_grad(backend.asarray(ds.x_train[idx]), backend.asarray(ds.y_train[idx])))
            compute[w] += time.perf_counter() - c0
            if workers > 1:
                grads[w][...] = space.grad
        opt.step(space.data, round_mean(grads, mean_buf), lr_at(step))
        step += 1
        loss = float(np.mean(losses))
        elapsed = time.perf_counter() - t0
        if elapsed >= next_eval:
            test_loss, test_acc = model.evaluate(x_eval, y_eval, batch_size=job.eval.batch_size)
            evals.append((elapsed, step, test_loss, test_acc))
            targets.observe(elapsed, test_acc)
            next_eval = elapsed + job.eval.every_seconds
        if elapsed >= next_checkpoint:
            checkpoint(elapsed)
            next_checkpoint = elapsed + every
        progress.update(step, loss=loss, test_acc=test_acc, epoch=round(streams[0].epochs_done, 2))
    wall = time.perf_counter() - t0
    signal.signal(signal.SIGTERM, previous_handler)
    if terminate:
        log.warning("SIGTERM: stopped at step %d, after a checkpoint", step)

    test_loss, test_acc = model.evaluate(x_eval, y_eval, batch_size=job.eval.batch_size)
    targets.observe(wall, test_acc)
    evals.append((wall, step, test_loss, test_acc))
    checkpoint(wall)  # the end, or where SIGTERM stopped it: a longer run can go on from here
    progress.close(step, loss=loss, test_acc=test_acc, epoch=round(streams[0].epochs_done, 2))

    summary = build_summary(
        job, sync=job.sync.model if workers > 1 else "single", world_size=1, backend=backend.describe(),
        wall_seconds=wall, iterations=[step] * workers, wait_seconds=[0.0] * workers,
        compute_seconds=compute.tolist(), injected_delay_seconds=None,
        barriers=step if workers > 1 else 0, rejected_pushes=0, versions=step,
        train_loss=loss, test_loss=test_loss, test_accuracy=test_acc, targets=targets, evals=evals,
        mpi_library=None)
    write_model(run_dir, space.state_dict(), version=step, step=step,
                attrs={"sync": summary["sync"], "config_json": to_dict(job)})
    write_summary(run_dir, summary)
    return summary


def _should_stop(job: JobConfig, step: int, limit: int | None, elapsed: float) -> bool:
    if limit is not None and step >= limit:
        return True
    return bool(job.stop.seconds) and elapsed >= job.stop.seconds
