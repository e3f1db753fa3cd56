"""MNIST / Fashion-MNIST IDX reading: round trips (raw and .gz) and every error."""

import gzip
import os
import re
import struct

import numpy
import pytest

from datafiles import load_error
from ebsp_mpi.data import DatasetError, load_dataset
from ebsp_mpi.data.idx import read_idx

FILES = ("train-images-idx3-ubyte", "train-labels-idx1-ubyte", "t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte")


def idx_bytes(array, magic):
    """An unsigned-byte IDX file holding ``array``."""
    header = struct.pack(">i", magic) + struct.pack(">" + "I" * array.ndim, *array.shape)
    return header + numpy.ascontiguousarray(array, dtype=numpy.uint8).tobytes()


def write(path, data, gz=False):
    if gz:
        path = str(path) + ".gz"
        data = gzip.compress(data)
    with open(path, "wb") as f:
        f.write(data)
    return path


def make_mnist(root, n_train=7, n_test=3, gz=False, seed=0):
    """Tiny MNIST-layout files in ``root``; returns the arrays written."""
    rng = numpy.random.default_rng(seed)
    arrays = {
        "train": (rng.integers(0, 256, (n_train, 28, 28), dtype=numpy.uint8),
                  rng.integers(0, 10, n_train, dtype=numpy.uint8)),
        "t10k": (rng.integers(0, 256, (n_test, 28, 28), dtype=numpy.uint8),
                 rng.integers(0, 10, n_test, dtype=numpy.uint8)),
    }
    for split, (images, labels) in arrays.items():
        write(os.path.join(root, f"{split}-images-idx3-ubyte"), idx_bytes(images, 2051), gz)
        write(os.path.join(root, f"{split}-labels-idx1-ubyte"), idx_bytes(labels, 2049), gz)
    return arrays


@pytest.mark.parametrize("gz", [False, True])
@pytest.mark.parametrize("name", ["mnist", "fashion-mnist"])
def test_round_trip_raw_values(tmp_path, name, gz):
    arrays = make_mnist(tmp_path, gz=gz)
    ds = load_dataset(name, root=str(tmp_path), normalize=False)
    assert ds.name == name
    assert ds.input_shape == (1, 28, 28)
    assert ds.num_classes == 10
    assert ds.x_train.shape == (7, 1, 28, 28) and ds.x_test.shape == (3, 1, 28, 28)
    assert ds.x_train.dtype == numpy.float32 and ds.y_train.dtype == numpy.int64
    assert ds.x_train.flags.c_contiguous and ds.x_test.flags.c_contiguous
    numpy.testing.assert_array_equal(ds.x_train[:, 0], arrays["train"][0])
    numpy.testing.assert_array_equal(ds.y_train, arrays["train"][1])
    numpy.testing.assert_array_equal(ds.x_test[:, 0], arrays["t10k"][0])
    numpy.testing.assert_array_equal(ds.y_test, arrays["t10k"][1])


def test_official_split_ignores_test_fraction_and_max_train_keeps_first(tmp_path):
    arrays = make_mnist(tmp_path)
    ds = load_dataset("mnist", root=str(tmp_path), normalize=False, test_fraction=0.5, max_train=4)
    assert ds.num_test == 3
    numpy.testing.assert_array_equal(ds.y_train, arrays["train"][1][:4])


def test_normalised_with_train_statistics(tmp_path):
    arrays = make_mnist(tmp_path, n_train=20)
    ds = load_dataset("mnist", root=str(tmp_path))
    train = arrays["train"][0].astype(numpy.float64)
    mean, std = train.mean(), train.std()
    assert abs(float(ds.x_train.mean())) < 1e-5
    assert float(ds.x_train.std()) == pytest.approx(1.0, abs=1e-5)
    expected_test = (arrays["t10k"][0] - mean) / std
    numpy.testing.assert_allclose(ds.x_test[:, 0], expected_test, rtol=1e-5, atol=1e-5)
    assert ds.mean.shape == (1,) and ds.std.shape == (1,)


def test_mixed_raw_and_gz(tmp_path):
    make_mnist(tmp_path, gz=True)
    os.remove(tmp_path / "t10k-labels-idx1-ubyte.gz")
    labels = numpy.arange(3, dtype=numpy.uint8)
    write(tmp_path / "t10k-labels-idx1-ubyte", idx_bytes(labels, 2049))
    ds = load_dataset("mnist", root=str(tmp_path), normalize=False)
    numpy.testing.assert_array_equal(ds.y_test, labels)


def test_missing_file_names_path_and_expected_files(tmp_path):
    make_mnist(tmp_path)
    os.remove(tmp_path / "t10k-images-idx3-ubyte")
    message = load_error("mnist", root=str(tmp_path))
    assert os.path.join(str(tmp_path), "t10k-images-idx3-ubyte") in message
    for name in FILES:
        assert name in message


def test_empty_root_says_what_root_must_hold():
    with pytest.raises(DatasetError, match=re.escape("data.root must name the directory")) as err:
        load_dataset("fashion-mnist", root="")
    assert "train-images-idx3-ubyte" in str(err.value)


def test_root_not_a_directory(tmp_path):
    with pytest.raises(DatasetError, match="not a directory") as err:
        load_dataset("mnist", root=str(tmp_path / "nowhere"))
    assert str(tmp_path / "nowhere") in str(err.value)


@pytest.mark.parametrize("gz", [False, True])
def test_wrong_magic_number(tmp_path, gz):
    make_mnist(tmp_path)
    # labels written where images belong: magic 2049 instead of 2051
    path = tmp_path / "train-images-idx3-ubyte"
    os.remove(path)
    write(path, idx_bytes(numpy.zeros((7, 28, 28), numpy.uint8), 2049), gz)
    with pytest.raises(DatasetError, match="magic number 2049; expected 2051") as err:
        load_dataset("mnist", root=str(tmp_path))
    assert "train-images-idx3-ubyte" in str(err.value)


@pytest.mark.parametrize("gz", [False, True])
def test_truncated_file(tmp_path, gz):
    make_mnist(tmp_path)
    path = tmp_path / "train-images-idx3-ubyte"
    data = idx_bytes(numpy.zeros((7, 28, 28), numpy.uint8), 2051)
    os.remove(path)
    write(path, data[:-100], gz)
    with pytest.raises(DatasetError, match="truncated") as err:
        load_dataset("mnist", root=str(tmp_path))
    assert "train-images-idx3-ubyte" in str(err.value)
    assert "7 x 28 x 28" in str(err.value)


def test_truncated_header(tmp_path):
    path = write(tmp_path / "x", struct.pack(">i", 2051) + b"\x00\x00\x00\x07")
    with pytest.raises(DatasetError, match="truncated"):
        read_idx(str(path), 2051)


def test_longer_than_header_says(tmp_path):
    path = write(tmp_path / "x", idx_bytes(numpy.zeros(5, numpy.uint8), 2049) + b"\x00")
    with pytest.raises(DatasetError, match="exactly 13 bytes"):
        read_idx(str(path), 2049)


def test_corrupt_gzip(tmp_path):
    make_mnist(tmp_path)
    compressed = gzip.compress(idx_bytes(numpy.zeros(7, numpy.uint8), 2049))
    os.remove(tmp_path / "train-labels-idx1-ubyte")
    write(tmp_path / "train-labels-idx1-ubyte.gz", compressed[: len(compressed) // 2])
    with pytest.raises(DatasetError, match="gzip") as err:
        load_dataset("mnist", root=str(tmp_path))
    assert "train-labels-idx1-ubyte.gz" in str(err.value)


def test_count_mismatch_between_images_and_labels(tmp_path):
    make_mnist(tmp_path)
    write(tmp_path / "train-labels-idx1-ubyte", idx_bytes(numpy.zeros(6, numpy.uint8), 2049))
    with pytest.raises(DatasetError, match=r"7 images but .* 6 labels"):
        load_dataset("mnist", root=str(tmp_path))


def test_wrong_image_size(tmp_path):
    make_mnist(tmp_path)
    write(tmp_path / "t10k-images-idx3-ubyte", idx_bytes(numpy.zeros((3, 32, 32), numpy.uint8), 2051))
    with pytest.raises(DatasetError, match="32 x 32 pixels; expected 28 x 28"):
        load_dataset("mnist", root=str(tmp_path))


def test_label_out_of_range(tmp_path):
    make_mnist(tmp_path)
    write(tmp_path / "t10k-labels-idx1-ubyte", idx_bytes(numpy.array([0, 10, 2], numpy.uint8), 2049))
    with pytest.raises(DatasetError, match=re.escape("label 10; expected labels 0..9")):
        load_dataset("mnist", root=str(tmp_path))
