"""The datasets that need no files (digits, synthetic) and load_dataset's own checks."""

import re

import numpy
import pytest

from datafiles import load_error
from ebsp_mpi.data import DATASETS, Dataset, DatasetError, load_dataset


def test_digits_sizes_and_classes():
    ds = load_dataset("digits")
    assert ds.num_train + ds.num_test == 1797
    assert ds.num_test == round(1797 * 0.2)
    assert ds.input_shape == (1, 8, 8) and ds.x_train.shape == (ds.num_train, 1, 8, 8)
    assert ds.num_classes == 10
    assert set(numpy.unique(ds.y_train)) == set(range(10))
    assert ds.x_train.dtype == numpy.float32 and ds.y_train.dtype == numpy.int64
    assert ds.x_train.flags.c_contiguous
    assert abs(float(ds.x_train.mean())) < 1e-5 and float(ds.x_train.std()) == pytest.approx(1.0, abs=1e-4)


def test_digits_raw_values_and_split_by_fraction_and_seed():
    raw = load_dataset("digits", normalize=False, test_fraction=0.5, seed=1)
    assert raw.num_test == round(1797 * 0.5)
    assert raw.x_train.min() == 0.0 and raw.x_train.max() == 16.0
    assert numpy.array_equal(raw.x_train, numpy.round(raw.x_train))
    same = load_dataset("digits", normalize=False, test_fraction=0.5, seed=1)
    numpy.testing.assert_array_equal(same.y_test, raw.y_test)
    other = load_dataset("digits", normalize=False, test_fraction=0.5, seed=2)
    assert not numpy.array_equal(other.y_test, raw.y_test)


def test_digits_does_not_import_sklearn():
    import subprocess
    import sys

    code = "import sys, ebsp_mpi.data as d; d.load_dataset('digits'); print('sklearn' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_max_train_keeps_first_samples_after_split():
    full = load_dataset("digits", normalize=False)
    small = load_dataset("digits", normalize=False, max_train=100)
    assert small.num_train == 100
    numpy.testing.assert_array_equal(small.x_train, full.x_train[:100])
    numpy.testing.assert_array_equal(small.x_test, full.x_test)
    assert load_dataset("digits", max_train=10**6).num_train == full.num_train


def test_synthetic_deterministic_per_seed():
    kwargs = dict(synthetic_samples=600, synthetic_features=12, synthetic_classes=5, synthetic_hidden=16)
    a = load_dataset("synthetic", seed=7, **kwargs)
    b = load_dataset("synthetic", seed=7, **kwargs)
    c = load_dataset("synthetic", seed=8, **kwargs)
    numpy.testing.assert_array_equal(a.x_train, b.x_train)
    numpy.testing.assert_array_equal(a.y_train, b.y_train)
    numpy.testing.assert_array_equal(a.y_test, b.y_test)
    assert not numpy.array_equal(a.x_train, c.x_train)
    assert not numpy.array_equal(a.y_train, c.y_train)
    assert a.input_shape == (12,) and a.num_classes == 5
    assert (a.num_train, a.num_test) == (480, 120)


def test_synthetic_labels_use_several_classes():
    ds = load_dataset("synthetic", synthetic_samples=2000, synthetic_classes=10)
    counts = numpy.bincount(numpy.concatenate([ds.y_train, ds.y_test]), minlength=10)
    assert (counts > 0).sum() == 10
    assert counts.max() < 0.3 * counts.sum()  # no class dominates


def test_synthetic_labels_are_the_teachers():
    # The same inputs give the same labels whatever the sample count: labels are a
    # function of the input and the seed, not of the batch the teacher saw.
    from ebsp_mpi.data.synthetic import load_synthetic, teacher_labels

    x, y, _, _ = load_synthetic(300, 8, 4, 6, seed=3)
    numpy.testing.assert_array_equal(teacher_labels(x[:17], 4, 6, seed=3), y[:17])
    assert not numpy.array_equal(teacher_labels(x, 4, 6, seed=4), y)


def test_synthetic_bad_sizes():
    with pytest.raises(DatasetError, match=re.escape("data.synthetic_classes = 1")):
        load_dataset("synthetic", synthetic_classes=1)


def test_unknown_name_lists_datasets():
    message = load_error("imagenet")
    assert "'imagenet'" in message
    for name in DATASETS:
        assert name in message


@pytest.mark.parametrize("fraction", [0.0, 1.0, -0.1, 1e-9])
def test_bad_test_fraction(fraction):
    with pytest.raises(DatasetError, match="test"):
        load_dataset("digits", test_fraction=fraction)


def test_bad_seed_and_max_train():
    with pytest.raises(DatasetError, match="seed"):
        load_dataset("digits", seed=-1)
    with pytest.raises(DatasetError, match="max_train"):
        load_dataset("digits", max_train=-5)


def test_dataset_checks_shapes():
    x = numpy.zeros((4, 3), numpy.float32)
    y = numpy.zeros(4, numpy.int64)
    with pytest.raises(DatasetError, match="x_test"):
        Dataset("t", x, y, x[:, :2], y, 2, (3,))
    with pytest.raises(DatasetError, match="y_train"):
        Dataset("t", x, y[:3], x, y, 2, (3,))
    assert "train=4" in repr(Dataset("t", x, y, x, y, 2, (3,)))
