"""The user's own HDF5 file: with and without a test split, and every error."""

import re

import numpy
import pytest

from datafiles import write_h5
from ebsp_mpi.data import DatasetError, load_dataset


def vectors(n=20, d=5, classes=4, seed=0):
    rng = numpy.random.default_rng(seed)
    return rng.normal(3.0, 2.0, (n, d)), rng.integers(0, classes, n)


def test_with_test_split_round_trip(tmp_path):
    x, y = vectors()
    xt, yt = vectors(6, seed=1)
    path = write_h5(tmp_path / "d.h5", x=x.astype(numpy.float64), y=y.astype(numpy.int16), x_test=xt, y_test=yt)
    ds = load_dataset("hdf5", path=path, normalize=False, test_fraction=0.5)
    assert ds.input_shape == (5,)
    assert ds.x_train.dtype == numpy.float32 and ds.y_train.dtype == numpy.int64
    numpy.testing.assert_allclose(ds.x_train, x.astype(numpy.float32))
    numpy.testing.assert_array_equal(ds.y_train, y)
    numpy.testing.assert_allclose(ds.x_test, xt.astype(numpy.float32))
    numpy.testing.assert_array_equal(ds.y_test, yt)
    assert ds.num_classes == max(y.max(), yt.max()) + 1


def test_without_test_split_is_seeded_partition(tmp_path):
    x, y = vectors(n=40)
    # tag each sample so the split can be traced back
    x[:, 0] = numpy.arange(40)
    path = write_h5(tmp_path / "d.h5", x=x, y=y)
    ds = load_dataset("hdf5", path=path, normalize=False, test_fraction=0.25, seed=3)
    assert (ds.num_train, ds.num_test) == (30, 10)
    ids = numpy.concatenate([ds.x_train[:, 0], ds.x_test[:, 0]]).astype(int)
    assert sorted(ids.tolist()) == list(range(40))
    numpy.testing.assert_array_equal(ds.y_train, y[ds.x_train[:, 0].astype(int)])
    numpy.testing.assert_array_equal(ds.y_test, y[ds.x_test[:, 0].astype(int)])
    again = load_dataset("hdf5", path=path, normalize=False, test_fraction=0.25, seed=3)
    numpy.testing.assert_array_equal(again.x_test, ds.x_test)
    other = load_dataset("hdf5", path=path, normalize=False, test_fraction=0.25, seed=4)
    assert not numpy.array_equal(other.x_test[:, 0], ds.x_test[:, 0])


def test_normalised_per_feature(tmp_path):
    x, y = vectors(n=50)
    x[:, 2] = 7.0  # a constant feature must not turn into NaN
    path = write_h5(tmp_path / "d.h5", x=x, y=y)
    ds = load_dataset("hdf5", path=path, test_fraction=0.2)
    assert numpy.isfinite(ds.x_train).all() and numpy.isfinite(ds.x_test).all()
    numpy.testing.assert_allclose(ds.x_train.mean(axis=0), 0.0, atol=1e-5)
    numpy.testing.assert_allclose(numpy.delete(ds.x_train.std(axis=0), 2), 1.0, atol=1e-5)
    assert (ds.x_train[:, 2] == 0).all()


def test_images_get_a_channel_axis(tmp_path):
    rng = numpy.random.default_rng(0)
    path = write_h5(tmp_path / "d.h5", x=rng.integers(0, 255, (10, 4, 6), dtype=numpy.uint8),
                    y=numpy.arange(10) % 3)
    ds = load_dataset("hdf5", path=path, test_fraction=0.2)
    assert ds.input_shape == (1, 4, 6) and ds.x_train.shape == (8, 1, 4, 6)
    path4 = write_h5(tmp_path / "e.h5", x=rng.normal(size=(10, 3, 4, 4)), y=numpy.arange(10) % 3)
    assert load_dataset("hdf5", path=path4).input_shape == (3, 4, 4)


def test_num_classes_attribute(tmp_path):
    x, y = vectors(classes=3)
    ds = load_dataset("hdf5", path=write_h5(tmp_path / "a.h5", attrs={"num_classes": 12}, x=x, y=y))
    assert ds.num_classes == 12
    with pytest.raises(DatasetError, match="num_classes = 2"):
        load_dataset("hdf5", path=write_h5(tmp_path / "b.h5", attrs={"num_classes": 2}, x=x, y=y))
    with pytest.raises(DatasetError, match="expected an integer"):
        load_dataset("hdf5", path=write_h5(tmp_path / "c.h5", attrs={"num_classes": 2.5}, x=x, y=y))


def test_missing_file_names_path(tmp_path):
    path = str(tmp_path / "absent.h5")
    with pytest.raises(DatasetError, match="missing dataset file") as err:
        load_dataset("hdf5", path=path)
    assert path in str(err.value) and "'x'" in str(err.value)


def test_empty_path():
    with pytest.raises(DatasetError, match=re.escape("data.path")):
        load_dataset("hdf5")


def test_not_hdf5(tmp_path):
    path = tmp_path / "d.h5"
    path.write_bytes(b"this is not hdf5")
    with pytest.raises(DatasetError, match="not a readable HDF5 file") as err:
        load_dataset("hdf5", path=str(path))
    assert str(path) in str(err.value)


def test_missing_dataset(tmp_path):
    x, _ = vectors()
    with pytest.raises(DatasetError, match="no dataset 'y'"):
        load_dataset("hdf5", path=write_h5(tmp_path / "d.h5", x=x))


def test_mismatched_lengths(tmp_path):
    x, y = vectors()
    with pytest.raises(DatasetError, match="'y' holds 19 labels but 'x' holds 20"):
        load_dataset("hdf5", path=write_h5(tmp_path / "d.h5", x=x, y=y[:-1]))
    xt, yt = vectors(6)
    with pytest.raises(DatasetError, match="'y_test' holds 5 labels but 'x_test' holds 6"):
        load_dataset("hdf5", path=write_h5(tmp_path / "e.h5", x=x, y=y, x_test=xt, y_test=yt[:-1]))


def test_non_integer_labels(tmp_path):
    x, y = vectors()
    with pytest.raises(DatasetError, match="'y' has dtype float64; expected integer"):
        load_dataset("hdf5", path=write_h5(tmp_path / "d.h5", x=x, y=y.astype(numpy.float64)))


def test_negative_labels(tmp_path):
    x, y = vectors()
    y[3] = -1
    with pytest.raises(DatasetError, match="negative label -1"):
        load_dataset("hdf5", path=write_h5(tmp_path / "d.h5", x=x, y=y))


def test_test_split_shape_mismatch(tmp_path):
    x, y = vectors(d=5)
    xt, yt = vectors(n=4, d=6)
    with pytest.raises(DatasetError, match="'x_test' has samples of shape"):
        load_dataset("hdf5", path=write_h5(tmp_path / "d.h5", x=x, y=y, x_test=xt, y_test=yt))


def test_half_a_test_split(tmp_path):
    x, y = vectors()
    with pytest.raises(DatasetError, match="holds 'x_test' but not 'y_test'"):
        load_dataset("hdf5", path=write_h5(tmp_path / "d.h5", x=x, y=y, x_test=x))


def test_labels_must_be_one_dimensional(tmp_path):
    x, y = vectors()
    with pytest.raises(DatasetError, match=r"'y' has shape \(20, 1\)"):
        load_dataset("hdf5", path=write_h5(tmp_path / "d.h5", x=x, y=y[:, None]))


def test_non_numeric_inputs(tmp_path):
    _, y = vectors()
    x = numpy.array([[b"ab"]] * 20)
    with pytest.raises(DatasetError, match=r"'x' has dtype .*; expected a numeric dtype"):
        load_dataset("hdf5", path=write_h5(tmp_path / "d.h5", x=x, y=y))
