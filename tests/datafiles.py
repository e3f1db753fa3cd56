"""Small data files the tests write: an HDF5 dataset file as ``data.name = "hdf5"`` reads it."""

import h5py


def write_h5(path, attrs=None, **datasets) -> str:
    """Write `datasets` (name -> array, e.g. ``x``, ``y``, ``x_test``) and root `attrs` to `path`."""
    with h5py.File(path, "w") as f:
        for key, value in datasets.items():
            f[key] = value
        for key, value in (attrs or {}).items():
            f.attrs[key] = value
    return str(path)
