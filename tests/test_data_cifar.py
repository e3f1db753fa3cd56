"""CIFAR-10 binary batches: round trip, layout, and errors."""

import os
import re

import numpy
import pytest

from datafiles import load_error
from ebsp_mpi.data import DatasetError, load_dataset

RECORD = 3073
TRAIN = [f"data_batch_{i}.bin" for i in range(1, 6)]


def write_cifar(directory, per_batch=2, n_test=3, seed=0):
    """Tiny CIFAR-10 binary batches; returns (images, labels) per file name."""
    os.makedirs(directory, exist_ok=True)
    rng = numpy.random.default_rng(seed)
    written = {}
    for name, n in [(f, per_batch) for f in TRAIN] + [("test_batch.bin", n_test)]:
        images = rng.integers(0, 256, (n, 3, 32, 32), dtype=numpy.uint8)
        labels = rng.integers(0, 10, n, dtype=numpy.uint8)
        records = numpy.concatenate([labels[:, None], images.reshape(n, -1)], axis=1)
        (directory / name).write_bytes(records.tobytes())
        written[name] = (images, labels)
    return written


@pytest.mark.parametrize("nested", [False, True])
def test_round_trip(tmp_path, nested):
    directory = tmp_path / "cifar-10-batches-bin" if nested else tmp_path
    written = write_cifar(directory)
    ds = load_dataset("cifar10", root=str(tmp_path), normalize=False)
    assert ds.input_shape == (3, 32, 32) and ds.num_classes == 10
    assert ds.x_train.shape == (10, 3, 32, 32) and ds.x_test.shape == (3, 3, 32, 32)
    assert ds.x_train.dtype == numpy.float32 and ds.y_train.dtype == numpy.int64
    images = numpy.concatenate([written[f][0] for f in TRAIN])
    labels = numpy.concatenate([written[f][1] for f in TRAIN])
    numpy.testing.assert_array_equal(ds.x_train, images)
    numpy.testing.assert_array_equal(ds.y_train, labels)
    numpy.testing.assert_array_equal(ds.x_test, written["test_batch.bin"][0])
    numpy.testing.assert_array_equal(ds.y_test, written["test_batch.bin"][1])


def test_channel_layout_is_red_green_blue_planes(tmp_path):
    write_cifar(tmp_path)
    record = numpy.zeros(RECORD, numpy.uint8)
    record[0] = 7
    record[1:1025] = 10   # red plane
    record[1025:2049] = 20  # green
    record[2049:] = 30   # blue
    (tmp_path / "test_batch.bin").write_bytes(record.tobytes())
    ds = load_dataset("cifar10", root=str(tmp_path), normalize=False)
    assert ds.y_test.tolist() == [7]
    assert [float(ds.x_test[0, c].mean()) for c in range(3)] == [10.0, 20.0, 30.0]


def test_normalised_per_channel_with_train_statistics(tmp_path):
    written = write_cifar(tmp_path, per_batch=4)
    ds = load_dataset("cifar10", root=str(tmp_path))
    train = numpy.concatenate([written[f][0] for f in TRAIN]).astype(numpy.float64)
    mean = train.mean(axis=(0, 2, 3))
    std = train.std(axis=(0, 2, 3))
    numpy.testing.assert_allclose(ds.mean, mean, rtol=1e-6)
    numpy.testing.assert_allclose(ds.std, std, rtol=1e-6)
    numpy.testing.assert_allclose(ds.x_train.mean(axis=(0, 2, 3)), 0.0, atol=1e-5)
    numpy.testing.assert_allclose(ds.x_train.std(axis=(0, 2, 3)), 1.0, atol=1e-5)
    test = written["test_batch.bin"][0].astype(numpy.float64)
    numpy.testing.assert_allclose(ds.x_test, (test - mean[:, None, None]) / std[:, None, None], rtol=1e-5,
                                  atol=1e-5)


def test_size_not_multiple_of_record(tmp_path):
    write_cifar(tmp_path)
    path = tmp_path / "data_batch_3.bin"
    path.write_bytes(path.read_bytes()[:-5])
    message = load_error("cifar10", root=str(tmp_path))
    assert str(path) in message and str(2 * RECORD - 5) in message and str(RECORD) in message


def test_missing_batch_names_path_and_files(tmp_path):
    write_cifar(tmp_path)
    os.remove(tmp_path / "test_batch.bin")
    message = load_error("cifar10", root=str(tmp_path))
    assert str(tmp_path / "test_batch.bin") in message
    assert "data_batch_1.bin" in message and "test_batch.bin" in message


def test_empty_root():
    with pytest.raises(DatasetError, match=re.escape("data.root must name the directory")):
        load_dataset("cifar10")


def test_label_out_of_range(tmp_path):
    write_cifar(tmp_path)
    path = tmp_path / "data_batch_2.bin"
    data = bytearray(path.read_bytes())
    data[RECORD] = 12  # second record's label
    path.write_bytes(bytes(data))
    with pytest.raises(DatasetError, match="record 1 has label 12"):
        load_dataset("cifar10", root=str(tmp_path))
