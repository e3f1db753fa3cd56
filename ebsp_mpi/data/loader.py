"""``load_dataset``: one entry point from a dataset name to a normalised ``Dataset``."""

from __future__ import annotations

import numpy

from .cifar import load_cifar10
from .dataset import Dataset, split_train_test
from .digits import load_digits
from .errors import DatasetError
from .finite import require_finite
from .hdf5 import load_hdf5
from .idx import load_idx_dataset
from .mnist1d import load_mnist1d
from .normalize import standardize
from .synthetic import load_synthetic

DATASETS = ("digits", "mnist", "fashion-mnist", "cifar10", "hdf5", "synthetic", "mnist1d")


def load_dataset(name: str, *, root: str = "", path: str = "", test_fraction: float = 0.2, seed: int = 0,
                 normalize: bool = True, max_train: int = 0, synthetic_samples: int = 10000,
                 synthetic_features: int = 64, synthetic_classes: int = 10,
                 synthetic_hidden: int = 64, samples: int = 5000) -> Dataset:
    """Load a dataset onto the host, split it and standardise it.

    Every rank calls this with the same arguments and gets the same arrays: the
    split and the synthetic data are functions of ``seed`` alone.

    Parameters
    ----------
    name : str
        One of ``DATASETS``.
    root : str
        Directory of the files for ``mnist``, ``fashion-mnist`` (four IDX files,
        raw or .gz) and ``cifar10`` (the binary batches, in ``root`` or
        ``root/cifar-10-batches-bin``); for ``mnist1d`` the directory of its cache (empty: the
        user's cache directory, see ``mnist1d.py``).
    path : str
        The HDF5 file for ``hdf5``.
    test_fraction : float
        Fraction held out for testing, in (0, 1), where the data has no official
        test split (``digits``, ``synthetic``, ``hdf5`` without ``x_test``).
    seed : int
        Seed (>= 0) of the split and of the synthetic data.
    normalize : bool
        Standardise with the training split's mean and std, per channel for
        images and per feature for vectors (see ``normalize.py``). When false the
        raw values are kept, as float32.
    max_train : int
        When > 0, keep only the first ``max_train`` training samples (after the
        split; before the statistics are taken), for quick runs.
    synthetic_samples, synthetic_features, synthetic_classes, synthetic_hidden : int
        Size of the ``synthetic`` task: samples N, input width D, classes and
        the teacher's hidden width.
    samples : int
        Samples of ``mnist1d`` generated (a multiple of 10; 80 % train, 20 % test).

    Returns
    -------
    Dataset
    """
    _check_arguments(name, seed, max_train)
    source = data_source(name, path)
    x_train, y_train, x_test, y_test, num_classes, input_shape = read_splits(
        name, root=root, path=path, test_fraction=test_fraction, seed=seed,
        synthetic=(synthetic_samples, synthetic_features, synthetic_classes, synthetic_hidden), samples=samples)
    classes_from = classes_origin(name, source, int(num_classes), y_train, y_test)
    x_train, y_train, x_test, y_test = _kept_arrays(x_train, y_train, x_test, y_test, max_train)
    mean = std = None
    if normalize:
        mean, std = standardize(x_train, x_test, source)
    return Dataset(name=name, x_train=x_train, y_train=y_train, x_test=x_test, y_test=y_test,
                   num_classes=int(num_classes), input_shape=tuple(input_shape), mean=mean, std=std,
                   classes_from=classes_from)


def _check_arguments(name: str, seed, max_train) -> None:
    if name not in DATASETS:
        raise DatasetError(f"unknown dataset {name!r}; expected one of {', '.join(DATASETS)}")
    if isinstance(seed, bool) or not isinstance(seed, (int, numpy.integer)) or seed < 0:
        raise DatasetError(f"data seed = {seed!r}; expected an integer >= 0")
    if isinstance(max_train, bool) or not isinstance(max_train, (int, numpy.integer)) or max_train < 0:
        raise DatasetError(f"data.max_train = {max_train!r}; expected an integer >= 0 (0 keeps every sample)")


def _kept_arrays(x_train, y_train, x_test, y_test, max_train: int):
    """The first `max_train` training samples (all for 0), inputs as contiguous float32, labels as int64."""
    if max_train:
        # A copy, so the full training array can be freed and the in-place
        # standardisation after this touches only what is kept.
        x_train, y_train = x_train[:max_train].copy(), y_train[:max_train].copy()
    # The readers already return fresh float32 arrays; this only guarantees it.
    x_train = numpy.ascontiguousarray(x_train, dtype=numpy.float32)
    x_test = numpy.ascontiguousarray(x_test, dtype=numpy.float32)
    return (x_train, numpy.ascontiguousarray(y_train, dtype=numpy.int64),
            x_test, numpy.ascontiguousarray(y_test, dtype=numpy.int64))


def data_source(name: str, path: str) -> str:
    """How error messages name the data: the job key a person would change."""
    return f"data.path = {path}" if name == "hdf5" else f"data.name = {name!r}"


def classes_origin(name: str, source: str, num_classes: int, y_train, y_test) -> str:
    """Where ``num_classes`` comes from (``Dataset.classes_from``), read before ``max_train`` cuts."""
    if name == "synthetic":
        return f"data.synthetic_classes = {num_classes}"
    if name != "hdf5":
        return f"dataset {name!r} has {num_classes} classes"
    largest = max(int(y_train.max()), int(y_test.max()))
    if num_classes == largest + 1:
        return f"the largest label in {source} is {largest}"
    return f"the root attribute num_classes = {num_classes} of {source}"


def read_splits(name: str, *, root: str, path: str, test_fraction: float, seed: int, synthetic: tuple,
                samples: int = 5000):
    """Raw float32 train and test splits of dataset ``name`` (official split, or seeded random split).

    Every reader's inputs pass one finite check here, before the split, so that a NaN or an Inf is
    named by its index in the file (:func:`~ebsp_mpi.data.finite.require_finite`).

    Returns
    -------
    x_train, y_train, x_test, y_test, num_classes, input_shape
    """
    where = data_source(name, path)
    if name in ("mnist", "fashion-mnist", "cifar10", "mnist1d"):
        splits = (load_cifar10(root) if name == "cifar10" else load_mnist1d(samples, root) if name == "mnist1d"
                  else load_idx_dataset(name, root))
        require_finite(splits[0], where, "x_train")
        require_finite(splits[2], where, "x_test")
        return splits
    if name == "hdf5":
        x, y, x_test, y_test, num_classes, input_shape = load_hdf5(path)
        require_finite(x, where, "x")
        if x_test is not None:
            require_finite(x_test, where, "x_test")
            return x, y, x_test, y_test, num_classes, input_shape
        source = path
    elif name == "digits":
        x, y, num_classes, input_shape = load_digits()
        require_finite(x, where, "x")
        source = name
    else:
        x, y, num_classes, input_shape = load_synthetic(*synthetic, seed)
        require_finite(x, where, "x")
        source = name
    return (*split_train_test(x, y, test_fraction, seed, source=source), num_classes, input_shape)
