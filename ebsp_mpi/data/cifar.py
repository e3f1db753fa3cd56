"""CIFAR-10, binary version (never the pickled Python version).

Each ``.bin`` file is a sequence of records of 1 label byte followed by 3072
pixel bytes: the 32 x 32 red plane, then green, then blue, each row-major --
exactly the ``(C, H, W)`` layout the models take.
"""

from __future__ import annotations

import os

import numpy

from .errors import DatasetError
from .files import find_file, read_bytes, require_root

IMAGE_SHAPE = (3, 32, 32)
RECORD_BYTES = 1 + 3 * 32 * 32
NUM_CLASSES = 10
TRAIN_FILES = tuple(f"data_batch_{i}.bin" for i in range(1, 6))
TEST_FILES = ("test_batch.bin",)
EXPECTED = TRAIN_FILES + TEST_FILES
SUBDIR = "cifar-10-batches-bin"


def read_batch(path: str):
    """Read one CIFAR-10 binary batch file.

    Returns
    -------
    x : numpy.ndarray
        float32 ``(N, 3, 32, 32)``, pixel values 0..255.
    y : numpy.ndarray
        int64 ``(N,)``, labels 0..9.
    """
    data = read_bytes(path)
    if len(data) == 0 or len(data) % RECORD_BYTES:
        raise DatasetError(f"{path}: {len(data)} bytes; expected a positive multiple of the record size "
                           f"{RECORD_BYTES} (1 label byte + 3072 pixel bytes)")
    records = numpy.frombuffer(data, dtype=numpy.uint8).reshape(-1, RECORD_BYTES)
    labels = records[:, 0]
    if labels.max() >= NUM_CLASSES:
        bad = int(numpy.argmax(labels >= NUM_CLASSES))
        raise DatasetError(f"{path}: record {bad} has label {int(labels[bad])}; expected 0..{NUM_CLASSES - 1} "
                           f"(is this the CIFAR-10 binary version?)")
    x = records[:, 1:].astype(numpy.float32).reshape((-1,) + IMAGE_SHAPE)
    return x, labels.astype(numpy.int64)


def batches_directory(root: str) -> str:
    """The directory holding the batch files: ``root`` itself or ``root/cifar-10-batches-bin``."""
    directory = require_root(root, "cifar10", EXPECTED)
    nested = os.path.join(directory, SUBDIR)
    if not os.path.isfile(os.path.join(directory, TRAIN_FILES[0])) and os.path.isdir(nested):
        return nested
    return directory


def read_files(directory: str, names: tuple):
    """Read and concatenate the named batch files of ``directory``."""
    parts = [read_batch(find_file(directory, name, EXPECTED, gz=False)) for name in names]
    return numpy.concatenate([p[0] for p in parts]), numpy.concatenate([p[1] for p in parts])


def load_cifar10(root: str):
    """Load CIFAR-10's official train (5 batches) and test split from ``root``.

    Returns
    -------
    x_train, y_train, x_test, y_test, num_classes, input_shape
    """
    directory = batches_directory(root)
    return (*read_files(directory, TRAIN_FILES), *read_files(directory, TEST_FILES), NUM_CLASSES, IMAGE_SHAPE)
