"""Benchmark: emulated training (``simulate --train``) against a bare loop of the same gradients and steps.

``python -m ebsp_mpi bench simulate --train`` runs each policy's emulation of n virtual workers x K
iterations in process (no traces, no evaluations) and, in the same run, the peer: a bare loop that
computes the same number of gradients on the same model and batch size and takes as many optimizer
steps, with no schedule, coordinator, version store or gradient buffers; its batches come from the
workers' streams in turn. What the emulation costs per push beyond the gradient and the step is
``emulation / bare - 1``; the target is at most 0.20. Building the data set and the streams is set-up,
timed in neither.

The model is the default job's MLP ([128] hidden, ReLU) on 64 features and 10 classes, trained by SGD
at lr 0.005 without momentum (at the default job's step, n stale pushes diverge); the data are
synthetic (``data.name = synthetic``), with 32 samples per batch and at least 4 batches per worker, so
that 1,024 workers each have a shard (the UCI digits' 1,438 training images shard to 44 at most).
The iteration times are the scaling study's pattern (``bench.workload.intervals``).
"""

from __future__ import annotations

import time

import numpy as np

from ebsp_mpi import build
from ebsp_mpi.bench.workload import chosen, intervals, keep, print_header, timed_simulation
from ebsp_mpi.config import load_job
from ebsp_mpi.run_description import describe
from ebsp_mpi.sim.training import EmulatedTrainer

BATCH = 32


def job_for(workers: int, iterations: int, seed: int):
    """The benchmark's job: the default MLP on synthetic data large enough for every worker's shard."""
    samples = max(10_000, int(workers * BATCH * 4 / 0.8) + 1)  # 80 % of the samples train
    # a small step without momentum: n stale pushes at the default job's step diverge (docs/simulation.md),
    # and a run of NaN gradients, rejected, would time something else
    return load_job(None, ["data.name=synthetic", f"data.synthetic_samples={samples}", f"data.batch_size={BATCH}",
                           "optim.lr=0.005", "optim.momentum=0",
                           "eval.every_seconds=1e9", f"stop.iterations={iterations}", "stop.epochs=0",
                           f"seed={seed}", "trace.enabled=false"])


def bare_loop(job, workers: int, gradients: int) -> float:
    """Seconds of `gradients` gradients, drawn from the `workers` batch streams in turn (as the workers
    draw them), and as many optimizer steps on one model; nothing else."""
    ds = build.dataset(job)
    model = build.model(job, ds)
    params = model.space.data.copy()
    opt, lr_at = build.optimizer(job, params.size), build.schedule(job)
    streams = [build.batch_stream(job, ds, w, workers) for w in range(workers)]
    started = time.perf_counter()
    for k in range(gradients):
        model.space.data[...] = params
        idx = streams[k % workers].next_indices()
        model.loss_and_grad(ds.x_train[idx], ds.y_train[idx])
        opt.step(params, model.space.grad, lr_at(k))
    return time.perf_counter() - started


def main_train(workers: int, iterations: int, seed: int, wanted: list[str], records: list | None,
               reps: int = 3) -> int:
    """Time each wanted policy's emulation against the bare loop; print one row per policy.

    Each emulation is paired with a bare loop timed just before it, and the ratio is taken within the
    pair: on a shared machine the speed drifts by more than the overhead measured (a single bare loop
    timed first was 8.4 s in one run and 12.6 s in another). The table gives medians over `reps`
    pairs and the range of the ratio."""
    job = job_for(workers, iterations, seed)
    table = intervals(workers, seed)
    gradients = workers * iterations
    print(f"emulated training: {workers} workers x {iterations} iterations = {gradients:,} gradients of the MLP "
          f"{job.model.hidden} on {job.data.synthetic_features} features, batch {BATCH}; {reps} pair(s) of runs "
          "per policy, each against a bare loop of the same gradients and steps (nothing else) timed just before it")
    header = (f"{'policy':<18} | {'seconds':>8} {'pushes/s':>9} | {'bare s':>7} | {'x bare loop':>11} "
              f"{'range':>11} {'overhead':>9} | {'copies':>6}")
    print_header(header)
    for label, sync in chosen(wanted):
        pairs = [_pair(job, workers, sync, table, iterations, seed) for _ in range(reps)]
        seconds, bare = float(np.median([p[0] for p in pairs])), float(np.median([p[1] for p in pairs]))
        ratios = sorted(p[0] / p[1] for p in pairs)
        ratio, peak = float(np.median(ratios)), pairs[-1][2]
        print(f"{label:<18} | {seconds:8.2f} {gradients / seconds:9.0f} | {bare:7.2f} | {ratio:11.2f} "
              f"{ratios[0]:5.2f}-{ratios[-1]:<5.2f} {ratio - 1:+9.1%} | {peak:>6}")
        # the figure and the reference are medians; their ratio is near, not equal to, the median ratio
        keep(records, f"train {label} n={workers} K={iterations}", seconds, "bare gradient + step loop", bare)
    return 0


def _pair(job, workers: int, sync, table, iterations: int, seed: int) -> tuple[float, float, int]:
    """``(emulation seconds, bare-loop seconds, peak version copies)``: the bare loop first, then the
    emulation, with the data and streams of each built outside its timing."""
    bare = bare_loop(job, workers, workers * iterations)
    trainer = EmulatedTrainer(describe(job, workers, None))  # the data and the streams: set-up, not per push
    _, seconds = timed_simulation(sync, workers, table, iterations, seed, trainer)
    return seconds, bare, trainer.versions.peak_copies
