"""From a job to the objects a run needs: dataset, model, optimizer, learning-rate schedule.

The single-process trainer, the parameter server and the workers all build through here, so they
agree on every shape, seed and hyper-parameter by construction.
"""

from __future__ import annotations

import numpy as np

from .config import JobConfig
from .data import BatchStream, Dataset, load_dataset
from .nn import SGD, Model, build_model, make_schedule


def dataset(job: JobConfig) -> Dataset:
    d = job.data
    return load_dataset(d.name, root=d.root, path=d.path, test_fraction=d.test_fraction, seed=job.seed,
                        normalize=d.normalize, max_train=d.max_train, synthetic_samples=d.synthetic_samples,
                        synthetic_features=d.synthetic_features, synthetic_classes=d.synthetic_classes,
                        synthetic_hidden=d.synthetic_hidden)


def model(job: JobConfig, ds: Dataset, xp=np, dtype=np.float32) -> Model:
    m = job.model
    return build_model(m.kind, ds.input_shape, ds.num_classes, hidden=tuple(m.hidden),
                       channels=tuple(m.channels), xp=xp, dtype=dtype, seed=job.seed)


def optimizer(job: JobConfig, size: int, xp=np, dtype=np.float32, fused: bool | None = None) -> SGD:
    o = job.optim
    return SGD(size, momentum=o.momentum, nesterov=o.nesterov, weight_decay=o.weight_decay, xp=xp, dtype=dtype,
               fused=fused)


def schedule(job: JobConfig):
    """Learning rate as a function of the optimizer step (the global model version)."""
    o = job.optim
    total = o.total_steps or job.stop.iterations or None
    return make_schedule(o.schedule, o.lr, total_steps=total, warmup_steps=o.warmup_steps,
                         step_size=o.step_size, gamma=o.gamma, min_lr=o.min_lr)


def batch_stream(job: JobConfig, ds: Dataset, worker: int, workers: int) -> BatchStream:
    """Worker `worker`'s minibatches: the same indices in the oracle and on MPI rank worker+1."""
    return BatchStream(len(ds.y_train), job.data.batch_size, worker=worker, workers=workers, seed=job.seed)


def iteration_limit(job: JobConfig, batches_per_epoch: int) -> int | None:
    """Iterations per worker allowed by ``stop.iterations`` and ``stop.epochs`` (None: only a time limit)."""
    limits = []
    if job.stop.iterations:
        limits.append(job.stop.iterations)
    if job.stop.epochs:
        limits.append(max(1, int(np.ceil(job.stop.epochs * batches_per_epoch))))
    return min(limits) if limits else None
