"""The UCI handwritten digits (8 x 8, 1797 samples), as scikit-learn ships them.

The CSV ``sklearn/datasets/data/digits.csv.gz`` holds one sample per row: 64
pixel values 0..16, then the label 0..9. It is read straight from the installed
package with NumPy: importing ``sklearn.datasets`` would cost seconds, locating
the package costs nothing.
"""

from __future__ import annotations

import importlib.resources
import importlib.util
import os

import numpy

from .errors import DatasetError

RESOURCE = ("datasets", "data", "digits.csv.gz")
IMAGE_SHAPE = (1, 8, 8)
NUM_SAMPLES = 1797
NUM_CLASSES = 10


def digits_path() -> str:
    """Path of scikit-learn's ``digits.csv.gz``, found without importing scikit-learn."""
    spec = importlib.util.find_spec("sklearn")
    if spec is None or not spec.submodule_search_locations:
        raise DatasetError("dataset 'digits' reads sklearn/datasets/data/digits.csv.gz, but scikit-learn is not "
                           "installed; install it (pip install scikit-learn) or choose another data.name")
    for location in spec.submodule_search_locations:
        path = os.path.join(location, *RESOURCE)
        if os.path.isfile(path):
            return path
    # A zipped or otherwise unusual install: ask importlib.resources (this one imports sklearn).
    resource = importlib.resources.files("sklearn.datasets.data") / RESOURCE[-1]
    if not resource.is_file():
        raise DatasetError(f"scikit-learn at {list(spec.submodule_search_locations)} has no "
                           f"{'/'.join(RESOURCE)}; expected the UCI digits CSV there")
    return str(resource)


def load_digits():
    """All 1797 digits, unsplit.

    Returns
    -------
    x : numpy.ndarray
        float32 ``(1797, 1, 8, 8)``, pixel values 0..16.
    y : numpy.ndarray
        int64 ``(1797,)``, labels 0..9.
    num_classes : int
    input_shape : tuple
    """
    path = digits_path()
    try:
        table = numpy.loadtxt(path, delimiter=",", dtype=numpy.float32)
    except (OSError, ValueError, EOFError) as e:
        raise DatasetError(f"{path}: cannot parse the digits CSV ({e})") from None
    if table.ndim != 2 or table.shape[1] != 65:
        raise DatasetError(f"{path}: table of shape {table.shape}; expected (N, 65): 64 pixels and the label")
    x = numpy.ascontiguousarray(table[:, :64]).reshape((-1,) + IMAGE_SHAPE)
    y = table[:, 64].astype(numpy.int64)
    return x, y, NUM_CLASSES, IMAGE_SHAPE
