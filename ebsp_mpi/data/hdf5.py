"""A user's own data in one HDF5 file.

The file holds a dataset ``x`` (shape ``(N, ...)``, any numeric dtype) and a
dataset ``y`` (integer labels, shape ``(N,)``), and optionally ``x_test`` and
``y_test`` with the same layout; without them the test split is drawn at
random. ``x`` of shape ``(N, H, W)`` is read as single-channel images
``(N, 1, H, W)`` so that it meets the ``(C, H, W)`` convention of the models;
``(N, D)`` stays a vector. ``num_classes`` is the file's root attribute of that
name when present, else the largest label + 1.
"""

from __future__ import annotations

import math
import os

import numpy

from .errors import DatasetError
from .memory import exceeds_memory, format_bytes, memory_phrase

EXPECTED = "datasets 'x' (N, ...) and 'y' (N,) of integer labels, optionally 'x_test' and 'y_test'"


def read_inputs(f, key: str, path: str) -> numpy.ndarray:
    """Read the numeric array ``key`` as float32 with a channel axis for ``(N, H, W)``."""
    dataset = dataset_or_error(f, key, path)
    if dataset.dtype.kind not in "buif":
        raise DatasetError(f"{path}: dataset {key!r} has dtype {dataset.dtype}; expected a numeric dtype")
    if dataset.ndim < 2 or dataset.shape[0] == 0:
        raise DatasetError(f"{path}: dataset {key!r} has shape {dataset.shape}; expected (N, ...) with N >= 1 "
                           f"and at least one feature axis")
    _require_fits(dataset, key, path)
    # a float64 beyond float32's range becomes inf here; the loader's finite check names the sample
    with numpy.errstate(over="ignore"):
        x = numpy.ascontiguousarray(dataset[...], dtype=numpy.float32)
    return x[:, None] if x.ndim == 3 else x


def _require_fits(dataset, key: str, path: str) -> None:
    """Refuse inputs whose float32 copy (plus the array read in the file's dtype) exceeds the memory."""
    elements = math.prod(dataset.shape)
    read = elements * dataset.dtype.itemsize if dataset.dtype != numpy.float32 else 0
    need = read + elements * 4
    if exceeds_memory(need):
        raise DatasetError(f"{path}: dataset {key!r} of shape {dataset.shape} and dtype {dataset.dtype} needs "
                           f"{format_bytes(need)} to load as float32, more than {memory_phrase()}; "
                           f"use a subset of the samples or fewer features")


def read_labels(f, key: str, path: str, count: int, inputs_key: str) -> numpy.ndarray:
    """Read the integer labels ``key`` and check them against ``count`` inputs."""
    dataset = dataset_or_error(f, key, path)
    if dataset.dtype.kind not in "iu":
        raise DatasetError(f"{path}: dataset {key!r} has dtype {dataset.dtype}; expected integer class labels")
    if dataset.ndim != 1:
        raise DatasetError(f"{path}: dataset {key!r} has shape {dataset.shape}; expected ({count},), "
                           f"one label per row of {inputs_key!r}")
    if dataset.shape[0] != count:
        raise DatasetError(f"{path}: dataset {key!r} holds {dataset.shape[0]} labels but {inputs_key!r} holds "
                           f"{count} samples; expected the same count")
    y = dataset[...]
    # uint64 labels beyond int64 would wrap to negative ones in the cast and be reported wrongly
    if y.dtype.kind == "u" and int(y.max()) > numpy.iinfo(numpy.int64).max:
        raise DatasetError(f"{path}: dataset {key!r} holds the label {int(y.max())}; "
                           f"expected labels 0, 1, ..., num_classes - 1")
    y = y.astype(numpy.int64)
    if y.min() < 0:
        raise DatasetError(f"{path}: dataset {key!r} holds the negative label {int(y.min())}; "
                           f"expected labels 0, 1, ..., num_classes - 1")
    return y


def dataset_or_error(f, key: str, path: str):
    """The HDF5 dataset ``key`` of ``f``, or an error listing what the file holds."""
    import h5py

    if key not in f:
        raise DatasetError(f"{path}: no dataset {key!r} (the file holds {sorted(f.keys())}); expected {EXPECTED}")
    item = f[key]
    if not isinstance(item, h5py.Dataset):
        raise DatasetError(f"{path}: {key!r} is a group, not a dataset; expected {EXPECTED}")
    return item


def class_count(f, path: str, largest_label: int) -> int:
    """``num_classes`` from the file's attribute when present, else the largest label + 1."""
    if "num_classes" not in f.attrs:
        return largest_label + 1
    value = f.attrs["num_classes"]
    if isinstance(value, (bool, numpy.bool_)) or not isinstance(value, (int, numpy.integer)):
        raise DatasetError(f"{path}: attribute num_classes = {value!r}; expected an integer")
    value = int(value)
    if value <= largest_label:
        raise DatasetError(f"{path}: attribute num_classes = {value}, but the file holds label {largest_label}; "
                           f"expected num_classes > every label")
    return value


def load_hdf5(path: str):
    """Load ``x``/``y`` (and ``x_test``/``y_test`` when present) from an HDF5 file.

    Parameters
    ----------
    path : str
        The file (``data.path``); ``~`` is expanded.

    Returns
    -------
    x, y, x_test, y_test, num_classes, input_shape
        ``x_test`` and ``y_test`` are ``None`` when the file has no test split.
    """
    import h5py

    if not path:
        raise DatasetError(f"dataset 'hdf5' needs data.path: the HDF5 file with {EXPECTED}")
    path = os.path.abspath(os.path.expanduser(path))
    if not os.path.isfile(path):
        raise DatasetError(f"missing dataset file {path!r}; expected an HDF5 file with {EXPECTED}")
    try:
        f = h5py.File(path, "r")
    except OSError as e:
        raise DatasetError(f"{path}: not a readable HDF5 file ({e}); expected {EXPECTED}") from None
    with f:
        x = read_inputs(f, "x", path)
        y = read_labels(f, "y", path, x.shape[0], "x")
        if ("x_test" in f) != ("y_test" in f):
            present, absent = ("x_test", "y_test") if "x_test" in f else ("y_test", "x_test")
            raise DatasetError(f"{path}: holds {present!r} but not {absent!r}; expected both or neither")
        x_test = y_test = None
        largest = int(y.max())
        if "x_test" in f:
            x_test = read_inputs(f, "x_test", path)
            if x_test.shape[1:] != x.shape[1:]:
                raise DatasetError(f"{path}: 'x_test' has samples of shape {f['x_test'].shape[1:]} but 'x' of "
                                   f"{f['x'].shape[1:]}; expected the same")
            y_test = read_labels(f, "y_test", path, x_test.shape[0], "x_test")
            largest = max(largest, int(y_test.max()))
        num_classes = class_count(f, path, largest)
    return x, y, x_test, y_test, num_classes, x.shape[1:]
