"""Small data files the tests write: an HDF5 dataset file as ``data.name = "hdf5"`` reads it; and the
message of a dataset that fails to load."""

import h5py
import numpy as np
import pytest

from ebsp_mpi.data import DatasetError, load_dataset


def load_error(name: str, **kwargs) -> str:
    """The message of the DatasetError that loading dataset `name` with `kwargs` raises."""
    with pytest.raises(DatasetError) as err:
        load_dataset(name, **kwargs)
    return str(err.value)


def write_h5(path, attrs=None, **datasets) -> str:
    """Write `datasets` (name -> array, e.g. ``x``, ``y``, ``x_test``) and root `attrs` to `path`."""
    with h5py.File(path, "w") as f:
        for key, value in datasets.items():
            f[key] = value
        for key, value in (attrs or {}).items():
            f.attrs[key] = value
    return str(path)


def write_poisoned(path) -> str:
    """200 samples of 8 features, 3 classes, whose sample 5 is near float32's largest value: it
    overflows its layer's output to inf, so the push of the batch that holds it is NaN (sample 5
    belongs to worker 1 of 2's strided shard; with batches of 10 it poisons one push per epoch). The
    test split is finite (NaN or Inf in the data itself is refused at load time)."""
    rng = np.random.default_rng(0)
    x = rng.normal(size=(200, 8)).astype(np.float32)
    x[5, :] = 3e38
    return write_h5(path, x=x, y=rng.integers(0, 3, size=200), x_test=np.where(x[:20] > 1e30, 0, x[:20]),
                    y_test=rng.integers(0, 3, size=20))
