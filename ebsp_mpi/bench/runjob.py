"""Run one training job through the real runtime on a group of ranks, from inside a benchmark.

``runtime.launch.run_mpi`` serves a whole ``mpiexec`` job; the benchmarks need several jobs in one
process, on a part of the ranks, sometimes with a worker whose gradient is replaced. This drives the
same classes (``Server`` on rank 0 of the group, ``Worker`` on the others) the same way.
"""

from __future__ import annotations

import contextlib
import shutil
import tempfile
import time
from pathlib import Path

import numpy as np


def run_job(ctx, job, worker_class=None, read=None, probe=None):
    """Run `job` on the ranks of `ctx` (``runtime.rank.start.setup``) in a temporary run directory.

    Returns the summary on rank 0 (with ``read``, a function of the run directory, also what it
    returns: ``(summary, read(run_dir))``) and the finished worker object on the other ranks. The run
    directory (traces, ``model.h5``) is deleted afterwards. `probe`: rank 0's ``ServerProbe``.
    """
    from ..run_description import read_osdp_plan
    from ..runtime.launch import close_push_window, make_role

    ctx.servers = job.runtime.servers
    path = ctx.comm.bcast(tempfile.mkdtemp(prefix="ebsp-bench-") if ctx.rank == 0 else None, root=0)
    try:
        role = make_role(ctx, job, Path(path), show_progress=False, worker_class=worker_class,
                         plan=read_osdp_plan(job), probe=probe)
        summary = role.run()  # rank 0's collects the workers' statistics
        result = summary if ctx.rank == 0 else role
        ctx.comm.Barrier()  # every trace file is closed, and no push is read any more
        close_push_window(ctx)
        if ctx.rank == 0 and read is not None:
            result = (result, read(Path(path)))
    finally:
        if ctx.rank == 0:
            shutil.rmtree(path, ignore_errors=True)
    return result


@contextlib.contextmanager
def gradient_clock():
    """Record when every model built meanwhile starts and ends a gradient computation
    (``loss_and_grad``).

    Yields the list the ``(start, end)`` pairs of ``time.perf_counter()`` readings are appended to:
    the differences of consecutive starts are iteration periods, and ``end - start`` is the time the
    forward and backward pass took, both measured alike in the single-process trainer and in a worker,
    with nothing in their code changed.
    """
    from .. import build

    spans: list[tuple[float, float]] = []
    original = build.model

    def timed_model(*args, **kwargs):
        model = original(*args, **kwargs)
        loss_and_grad = model.loss_and_grad

        def timed(*a, **k):
            start = time.perf_counter()
            loss = loss_and_grad(*a, **k)
            spans.append((start, time.perf_counter()))
            return loss

        model.loss_and_grad = timed
        return model

    build.model = timed_model
    try:
        yield spans
    finally:
        build.model = original


def breakdown(run_dir, warmup: int) -> dict:
    """Median seconds of the parts of worker 0's iterations, from a run's traces.

    ``compute``: its gradient (``t_compute_end - t_start``); ``push``: from the worker starting its push
    to the server holding all of it (``pushes.t - t_push``); ``server + pull``: from there to the
    worker holding the new weights (``t_end - pushes.t``: the sync policy, the
    update, the reply's copy, and under BSP the wait for the other workers); ``other``: the rest of the
    worker's loop. The first `warmup` iterations are left out.
    """
    from ..trace import read_run

    traces = read_run(run_dir)
    pushes = traces[0].table("pushes")
    pushes = pushes[pushes["worker"] == 0][warmup:]
    first_worker = min(rank for rank, t in traces.items() if t.role == "worker")
    it = traces[first_worker].table("iterations")[warmup:]
    n = min(len(it), len(pushes))
    it, pushes = it[:n], pushes[:n]
    parts = {"compute": it["t_compute_end"] - it["t_start"], "push": pushes["t"] - it["t_push"],
             "server + pull": it["t_end"] - pushes["t"]}
    parts["other"] = (it["t_end"] - it["t_start"]) - sum(parts.values())
    return {name: float(np.median(v)) for name, v in parts.items()}
