"""Sharding the training set over workers and drawing each worker's minibatches.

Shards are **strided**: worker ``k`` of ``n`` owns samples ``k, k + n, k + 2n, ...``.
Shard sizes then differ by at most one, and every shard samples the whole file
evenly even when the training set is stored sorted by class (a contiguous
block of a sorted file would hold only a few classes).

Each worker walks its shard in epochs. Epoch ``e`` visits the shard in the order
of a permutation drawn from ``numpy.random.default_rng([seed, worker, epoch])``
and cuts it into ``batches_per_epoch = shard_size // batch_size`` batches; the
last ``shard_size % batch_size`` samples of that order are dropped. Dropping
keeps every batch exactly ``batch_size`` long, so a BSP superstep over MPI
averages n equal-sized gradients -- the same as the single-process oracle's one
batch of n * batch_size samples -- and a different shuffle every epoch means a
different few samples are skipped each time.

The stream is a pure function of ``(num_samples, batch_size, worker, workers,
seed)`` and the iteration: the oracle trainer's ``BatchStream(worker=k)`` for
``k = 0..n-1`` and MPI rank ``r``'s ``BatchStream(worker=r - 1)`` draw the same
indices.
"""

from __future__ import annotations

import numpy

from .errors import DatasetError


def shard_indices(num_samples: int, workers: int, worker: int) -> numpy.ndarray:
    """The training-set indices owned by ``worker`` (strided shards).

    Parameters
    ----------
    num_samples : int
        Size of the training set.
    workers : int
        Number of workers n >= 1.
    worker : int
        This worker's index in ``[0, workers)`` (MPI rank worker + ``runtime.servers``).

    Returns
    -------
    numpy.ndarray
        int64, increasing: ``worker, worker + workers, ...`` below ``num_samples``.
        Over all workers the shards are disjoint and cover ``range(num_samples)``;
        sizes differ by at most one.
    """
    check_int("num_samples", num_samples, 0)
    check_int("workers", workers, 1)
    check_int("worker", worker, 0)
    if worker >= workers:
        raise DatasetError(f"worker = {worker}; expected an index in [0, {workers}) for {workers} workers")
    return numpy.arange(worker, num_samples, workers, dtype=numpy.int64)


def check_int(name: str, value, least: int) -> None:
    """Reject anything but an integer >= ``least``, naming the argument."""
    if isinstance(value, bool) or not isinstance(value, (int, numpy.integer)) or value < least:
        raise DatasetError(f"{name} = {value!r}; expected an integer >= {least}")


class BatchStream:
    """Worker ``worker`` of ``workers`` draws minibatches of ``batch_size`` from its shard.

    The shard is reshuffled every epoch with a generator seeded from
    ``(seed, worker, epoch)``, so the stream is a pure function of its
    arguments; the tail of each shuffled epoch (``shard_size % batch_size``
    samples) is dropped so that all batches have the same size (see the module
    docstring for why BSP needs that).

    Parameters
    ----------
    num_samples : int
        Size of the training set.
    batch_size : int
        Samples per batch (per worker), at most the shard size.
    worker, workers : int
        This worker's index and the number of workers.
    seed : int
        Seed (>= 0) of the epoch orders.

    Attributes
    ----------
    shard : numpy.ndarray
        int64 indices of this worker's shard (see ``shard_indices``).
    batches_per_epoch : int
        ``shard_size // batch_size``.
    iteration : int
        Batches drawn so far.
    """

    def __init__(self, num_samples: int, batch_size: int, *, worker: int = 0, workers: int = 1, seed: int = 0):
        check_int("batch_size", batch_size, 1)
        check_int("seed", seed, 0)
        self.shard = shard_indices(num_samples, workers, worker)
        if self.shard.size < batch_size:
            raise DatasetError(
                f"worker {worker} of {workers} has a shard of {self.shard.size} samples "
                f"({num_samples} training samples / {workers} workers), smaller than batch_size = {batch_size}; "
                f"lower the batch size or the number of workers, or use more data")
        self.num_samples = int(num_samples)
        self.batch_size = int(batch_size)
        self.worker = int(worker)
        self.workers = int(workers)
        self.seed = int(seed)
        self.batches_per_epoch = self.shard.size // self.batch_size
        self.iteration = 0
        self._order_epoch = -1
        self._order = self.shard

    @property
    def shard_size(self) -> int:
        """Samples in this worker's shard."""
        return int(self.shard.size)

    @property
    def epoch(self) -> int:
        """Epochs of this worker's shard completed so far."""
        return self.iteration // self.batches_per_epoch

    @property
    def epochs_done(self) -> float:
        """Fractional epochs completed: ``iteration / batches_per_epoch``."""
        return self.iteration / self.batches_per_epoch

    def epoch_order(self, epoch: int) -> numpy.ndarray:
        """The shard in the shuffled order of ``epoch`` (training-set indices, int64)."""
        check_int("epoch", epoch, 0)
        if epoch != self._order_epoch:
            rng = numpy.random.default_rng([self.seed, self.worker, int(epoch)])
            self._order = self.shard[rng.permutation(self.shard.size)]
            self._order_epoch = int(epoch)
        return self._order

    def indices_at(self, iteration: int) -> numpy.ndarray:
        """The batch of ``iteration`` (0-based), without moving the stream.

        Returns
        -------
        numpy.ndarray
            int64, exactly ``batch_size`` distinct indices into the training set.
        """
        check_int("iteration", iteration, 0)
        epoch, position = divmod(int(iteration), self.batches_per_epoch)
        start = position * self.batch_size
        return self.epoch_order(epoch)[start:start + self.batch_size].copy()

    def next_indices(self) -> numpy.ndarray:
        """The next batch: int64 indices into the training set, exactly ``batch_size`` of them."""
        batch = self.indices_at(self.iteration)
        self.iteration += 1
        return batch

    def seek(self, iteration: int) -> None:
        """Continue from ``iteration`` (e.g. when resuming): the next batch is ``indices_at(iteration)``."""
        check_int("iteration", iteration, 0)
        self.iteration = int(iteration)

    def __repr__(self) -> str:
        return (f"BatchStream(num_samples={self.num_samples}, batch_size={self.batch_size}, worker={self.worker}, "
                f"workers={self.workers}, seed={self.seed}, iteration={self.iteration})")


def worker_streams(num_samples: int, batch_size: int, workers: int, seed: int = 0) -> list:
    """One ``BatchStream`` per worker ``0..workers-1``: what the single-process oracle draws from.

    Concatenating their ``next_indices()`` gives the oracle's batch of
    ``workers * batch_size`` samples, the union of what n BSP workers draw in
    the same iteration.
    """
    check_int("workers", workers, 1)
    return [BatchStream(num_samples, batch_size, worker=k, workers=workers, seed=seed) for k in range(workers)]
