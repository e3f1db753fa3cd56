"""Shards and minibatch streams: the indices MPI workers and the oracle trainer draw."""

import numpy
import pytest

from ebsp_mpi.data import BatchStream, DatasetError, shard_indices, worker_streams


@pytest.mark.parametrize("n,workers", [(0, 1), (1, 1), (10, 1), (10, 3), (11, 4), (100, 7), (5, 8), (1000, 16)])
def test_shards_disjoint_and_covering(n, workers):
    shards = [shard_indices(n, workers, k) for k in range(workers)]
    joined = numpy.concatenate(shards)
    assert joined.dtype == numpy.int64
    assert len(joined) == n
    assert sorted(joined.tolist()) == list(range(n))
    sizes = [len(s) for s in shards]
    assert max(sizes) - min(sizes) <= 1


def test_shards_are_strided_and_deterministic():
    numpy.testing.assert_array_equal(shard_indices(10, 3, 1), [1, 4, 7])
    numpy.testing.assert_array_equal(shard_indices(10, 3, 1), shard_indices(10, 3, 1))


def test_shard_argument_errors():
    with pytest.raises(DatasetError, match=r"worker = 3; expected an index in \[0, 3\)"):
        shard_indices(10, 3, 3)
    with pytest.raises(DatasetError, match="workers = 0"):
        shard_indices(10, 0, 0)


def draw(stream, count):
    return [stream.next_indices() for _ in range(count)]


def test_stream_batches_have_exact_size_and_stay_in_shard():
    stream = BatchStream(103, 5, worker=2, workers=4, seed=1)
    shard = set(shard_indices(103, 4, 2).tolist())
    assert stream.shard_size == 26 and stream.batches_per_epoch == 5
    for batch in draw(stream, 23):
        assert batch.dtype == numpy.int64 and batch.shape == (5,)
        assert len(set(batch.tolist())) == 5
        assert set(batch.tolist()) <= shard


def test_stream_epoch_is_a_permutation_minus_a_tail():
    stream = BatchStream(50, 7, worker=0, workers=2, seed=0)  # shard 25, 3 batches, tail of 4 dropped
    epoch = numpy.concatenate(draw(stream, stream.batches_per_epoch))
    assert len(set(epoch.tolist())) == 21
    assert stream.epoch == 1 and stream.iteration == 3 and stream.epochs_done == 1.0
    stream.next_indices()
    assert stream.epoch == 1 and stream.epochs_done == pytest.approx(4 / 3)


def test_stream_deterministic_from_arguments():
    a = draw(BatchStream(200, 8, worker=1, workers=3, seed=5), 40)
    b = draw(BatchStream(200, 8, worker=1, workers=3, seed=5), 40)
    for x, y in zip(a, b, strict=True):
        numpy.testing.assert_array_equal(x, y)
    c = draw(BatchStream(200, 8, worker=1, workers=3, seed=6), 40)
    assert any(not numpy.array_equal(x, y) for x, y in zip(a, c, strict=True))


def test_stream_reshuffles_every_epoch():
    stream = BatchStream(64, 4, seed=0)
    epochs = [numpy.concatenate(draw(stream, stream.batches_per_epoch)) for _ in range(3)]
    for e in epochs:
        assert sorted(e.tolist()) == list(range(64))
    assert not numpy.array_equal(epochs[0], epochs[1])
    assert not numpy.array_equal(epochs[1], epochs[2])
    assert not numpy.array_equal(epochs[0], numpy.arange(64))


def test_workers_get_different_orders():
    # same shard positions, different workers: the orders must not be the same permutation
    a = BatchStream(40, 20, worker=0, workers=2, seed=0).next_indices() // 2
    b = BatchStream(40, 20, worker=1, workers=2, seed=0).next_indices() // 2
    assert not numpy.array_equal(a, b)


def test_indices_at_and_seek_match_the_stream():
    stream = BatchStream(90, 4, worker=0, workers=2, seed=3)
    batches = draw(stream, 30)
    probe = BatchStream(90, 4, worker=0, workers=2, seed=3)
    for it in (29, 0, 12, 11, 25):
        numpy.testing.assert_array_equal(probe.indices_at(it), batches[it])
    assert probe.iteration == 0
    probe.seek(17)
    numpy.testing.assert_array_equal(probe.next_indices(), batches[17])
    assert probe.iteration == 18


def test_returned_batch_is_a_copy():
    stream = BatchStream(30, 5, seed=0)
    first = stream.indices_at(0)
    first[:] = -1
    assert (stream.indices_at(0) >= 0).all()


@pytest.mark.parametrize("n,workers,batch", [(100, 3, 7), (64, 4, 16), (1000, 5, 1)])
def test_oracle_streams_equal_mpi_worker_streams(n, workers, batch):
    # the oracle trainer (world size 1) builds all n streams in one process ...
    oracle = worker_streams(n, batch, workers, seed=11)
    # ... and MPI rank r builds only its own, worker = r - 1
    ranks = {r: BatchStream(n, batch, worker=r - 1, workers=workers, seed=11) for r in range(1, workers + 1)}
    for _ in range(3 * max(s.batches_per_epoch for s in oracle) + 2):
        step = numpy.concatenate([s.next_indices() for s in oracle])
        mpi = numpy.concatenate([ranks[r].next_indices() for r in range(1, workers + 1)])
        numpy.testing.assert_array_equal(step, mpi)
        assert len(step) == workers * batch
        assert len(set(step.tolist())) == len(step)  # shards are disjoint, so no sample twice per step


def test_shard_smaller_than_batch():
    with pytest.raises(DatasetError) as err:
        BatchStream(10, 4, worker=2, workers=3)  # shard of worker 2: [2, 5, 8]
    message = str(err.value)
    assert "shard of 3 samples" in message and "batch_size = 4" in message and "10 training samples" in message
    with pytest.raises(DatasetError, match="shard of 3"):
        worker_streams(10, 4, 3)
    BatchStream(10, 3, worker=2, workers=3)  # equal is fine


def test_stream_argument_errors():
    with pytest.raises(DatasetError, match="batch_size = 0"):
        BatchStream(10, 0)
    with pytest.raises(DatasetError, match="seed = -1"):
        BatchStream(10, 2, seed=-1)
