"""The in-memory dataset record and the seeded train/test split."""

from __future__ import annotations

from dataclasses import dataclass

import numpy

from .errors import DatasetError

# Mixed into the split generator's seed so that the split never shares a random
# stream with the batch order (BatchStream seeds from (seed, worker, epoch)).
SPLIT_STREAM = 0x5B117


# eq=False: comparing arrays field by field has no single truth value.
@dataclass(eq=False)
class Dataset:
    """A labelled dataset held on the host as NumPy arrays.

    Attributes
    ----------
    name : str
        The dataset name, one of ``DATASETS``.
    x_train, x_test : numpy.ndarray
        float32, shape ``(N, *input_shape)``, C-contiguous; standardised with the
        training split's statistics unless loaded with ``normalize=False``.
    y_train, y_test : numpy.ndarray
        int64 class labels in ``[0, num_classes)``, shape ``(N,)``.
    num_classes : int
        Number of classes (the width of the model's output layer).
    input_shape : tuple of int
        ``(C, H, W)`` for images, ``(D,)`` for vectors.
    mean, std : numpy.ndarray or None
        The float32 per-channel (images) or per-feature (vectors) statistics the
        arrays were standardised with; ``None`` when not normalised.
    classes_from : str
        Where ``num_classes`` comes from, for messages about the output layer,
        e.g. ``"the largest label in data.path = x.h5 is 9"``; may be empty.
    """

    name: str
    x_train: numpy.ndarray
    y_train: numpy.ndarray
    x_test: numpy.ndarray
    y_test: numpy.ndarray
    num_classes: int
    input_shape: tuple
    mean: numpy.ndarray | None = None
    std: numpy.ndarray | None = None
    classes_from: str = ""

    def __post_init__(self):
        self.input_shape = tuple(int(d) for d in self.input_shape)
        for split in ("train", "test"):
            x = getattr(self, "x_" + split)
            y = getattr(self, "y_" + split)
            if tuple(x.shape[1:]) != self.input_shape:
                raise DatasetError(
                    f"dataset {self.name!r}: x_{split} has shape {x.shape}; expected (N, *{self.input_shape})")
            if y.shape != (x.shape[0],):
                raise DatasetError(
                    f"dataset {self.name!r}: y_{split} has shape {y.shape}; expected ({x.shape[0]},), "
                    f"one label per row of x_{split}")

    def __repr__(self) -> str:
        return (f"Dataset(name={self.name!r}, train={self.num_train}, test={self.num_test}, "
                f"num_classes={self.num_classes}, input_shape={self.input_shape})")

    @property
    def num_train(self) -> int:
        """Number of training samples."""
        return int(self.x_train.shape[0])

    @property
    def num_test(self) -> int:
        """Number of test samples."""
        return int(self.x_test.shape[0])


def split_train_test(x: numpy.ndarray, y: numpy.ndarray, test_fraction: float, seed: int, *, source: str):
    """Split samples into train and test by a seeded random permutation.

    The split is random, not stratified: with ``round(N * test_fraction)`` test
    samples the sizes are exact and the class balance follows the data.

    Parameters
    ----------
    x, y : numpy.ndarray
        Samples and labels, same first dimension N.
    test_fraction : float
        Fraction of samples held out, in (0, 1).
    seed : int
        Seed of the permutation (non-negative).
    source : str
        Names the data in error messages (a path or a dataset name).

    Returns
    -------
    x_train, y_train, x_test, y_test : numpy.ndarray
    """
    n = int(x.shape[0])
    if isinstance(test_fraction, bool) or not isinstance(test_fraction, (int, float, numpy.number)) \
            or not 0.0 < test_fraction < 1.0:
        raise DatasetError(f"{source}: data.test_fraction = {test_fraction!r}; expected a number in (0, 1)")
    n_test = int(round(n * test_fraction))  # noqa: RUF046 - under NumPy 1.x a NumPy fraction rounds to a float
    if n_test < 1 or n_test >= n:
        raise DatasetError(
            f"{source}: test_fraction = {test_fraction} of {n} samples leaves {n_test} test and "
            f"{n - n_test} training samples; both must be at least 1")
    order = numpy.random.default_rng([seed, SPLIT_STREAM]).permutation(n)
    test, train = order[:n_test], order[n_test:]
    return x[train], y[train], x[test], y[test]
