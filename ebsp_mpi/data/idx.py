"""MNIST and Fashion-MNIST from IDX files (LeCun et al.'s format, raw or gzip).

An IDX file is a big-endian header -- a 4-byte magic number whose third byte is
the element type (0x08: unsigned byte) and fourth the number of dimensions, then
one 4-byte size per dimension -- followed by the elements in C order. Image
files have magic 2051 (ubyte, 3 dims: count, rows, cols), label files 2049
(ubyte, 1 dim: count).
"""

from __future__ import annotations

import struct

import numpy

from .errors import DatasetError
from .files import find_file, read_bytes, require_root

IMAGES_MAGIC = 2051
LABELS_MAGIC = 2049
IMAGE_SIZE = (28, 28)
NUM_CLASSES = 10

FILES = {
    "train": ("train-images-idx3-ubyte", "train-labels-idx1-ubyte"),
    "test": ("t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte"),
}
EXPECTED = FILES["train"] + FILES["test"]


def read_idx(path: str, magic: int) -> numpy.ndarray:
    """Read one unsigned-byte IDX file and check its header against its size.

    Parameters
    ----------
    path : str
        File path (gzip is detected from the content).
    magic : int
        Expected magic number: 2051 for images, 2049 for labels.

    Returns
    -------
    numpy.ndarray
        uint8 array with the shape the header gives.

    Raises
    ------
    DatasetError
        Wrong magic number, or a file shorter (truncated) or longer than its header says.
    """
    data = read_bytes(path)
    ndim = magic & 0xFF
    header = 4 + 4 * ndim
    if len(data) < 4:
        raise DatasetError(f"{path}: {len(data)} bytes; too short for an IDX header (expected magic {magic})")
    (found,) = struct.unpack(">i", data[:4])
    if found != magic:
        kind = "images" if magic == IMAGES_MAGIC else "labels"
        raise DatasetError(f"{path}: magic number {found}; expected {magic} (IDX {kind}: unsigned bytes, "
                           f"{ndim} dimension{'s' if ndim > 1 else ''})")
    if len(data) < header:
        raise DatasetError(f"{path}: truncated: {len(data)} bytes, but an IDX header with {ndim} dimensions "
                           f"needs {header}")
    dims = struct.unpack(">" + "I" * ndim, data[4:header])
    expected = header + int(numpy.prod(dims, dtype=numpy.int64))
    if len(data) < expected:
        raise DatasetError(f"{path}: truncated: {len(data)} bytes, but the header says dimensions "
                           f"{' x '.join(map(str, dims))}, which need {expected} bytes")
    if len(data) > expected:
        raise DatasetError(f"{path}: {len(data)} bytes, but the header says dimensions "
                           f"{' x '.join(map(str, dims))}, which need exactly {expected} bytes")
    return numpy.frombuffer(data, dtype=numpy.uint8, offset=header).reshape(dims)


def read_split(images_path: str, labels_path: str):
    """Read one split's image and label files and check they agree.

    Returns
    -------
    x : numpy.ndarray
        float32 ``(N, 1, 28, 28)``, pixel values 0..255.
    y : numpy.ndarray
        int64 ``(N,)``, labels 0..9.
    """
    images = read_idx(images_path, IMAGES_MAGIC)
    labels = read_idx(labels_path, LABELS_MAGIC)
    if images.shape[1:] != IMAGE_SIZE:
        raise DatasetError(f"{images_path}: images of {images.shape[1]} x {images.shape[2]} pixels; "
                           f"expected {IMAGE_SIZE[0]} x {IMAGE_SIZE[1]}")
    if images.shape[0] != labels.shape[0]:
        raise DatasetError(f"{images_path} holds {images.shape[0]} images but {labels_path} holds "
                           f"{labels.shape[0]} labels; expected the same count")
    if images.shape[0] == 0:
        raise DatasetError(f"{images_path}: holds no images")
    if labels.max() >= NUM_CLASSES:
        raise DatasetError(f"{labels_path}: label {int(labels.max())}; expected labels 0..{NUM_CLASSES - 1}")
    x = images.astype(numpy.float32).reshape((-1, 1) + IMAGE_SIZE)
    return x, labels.astype(numpy.int64)


def load_idx_dataset(name: str, root: str):
    """Load MNIST-format train and test splits (the official split) from ``root``.

    Parameters
    ----------
    name : str
        ``"mnist"`` or ``"fashion-mnist"`` (same files, same layout).
    root : str
        Directory with the four IDX files, each raw or ``.gz``.

    Returns
    -------
    x_train, y_train, x_test, y_test, num_classes, input_shape
    """
    directory = require_root(root, name, EXPECTED)
    splits = []
    for split in ("train", "test"):
        images, labels = (find_file(directory, f, EXPECTED) for f in FILES[split])
        splits.extend(read_split(images, labels))
    return (*splits, NUM_CLASSES, (1,) + IMAGE_SIZE)
