"""Reading dataset files from disk: locating them and undoing gzip."""

from __future__ import annotations

import gzip
import os
import zlib

from .errors import DatasetError

GZIP_MAGIC = b"\x1f\x8b"


def require_root(root: str, dataset: str, expected: tuple) -> str:
    """Check that ``data.root`` names an existing directory.

    Parameters
    ----------
    root : str
        The directory given in the job (``data.root``); ``~`` is expanded.
    dataset : str
        Dataset name, for the message.
    expected : tuple of str
        File names the directory should hold, for the message.

    Returns
    -------
    str
        The expanded absolute directory path.
    """
    names = ", ".join(expected)
    if not root:
        raise DatasetError(
            f"dataset {dataset!r} needs data.root: data.root must name the directory with those files: {names}")
    path = os.path.abspath(os.path.expanduser(root))
    if not os.path.isdir(path):
        raise DatasetError(f"data.root = {path!r} is not a directory; dataset {dataset!r} expects it to hold {names}")
    return path


def find_file(directory: str, name: str, expected: tuple, *, gz: bool = True) -> str:
    """Path of ``name`` (or ``name.gz`` when ``gz``) in ``directory``.

    The raw file wins when both exist.

    Raises
    ------
    DatasetError
        Neither exists; the message names the full path and every expected file.
    """
    candidates = [os.path.join(directory, name)]
    if gz:
        candidates.append(candidates[0] + ".gz")
    for path in candidates:
        if os.path.isfile(path):
            return path
    tried = " or ".join(repr(p) for p in candidates)
    raise DatasetError(f"missing dataset file {tried}; expected in {directory!r}: {', '.join(expected)}"
                       + (" (each raw or .gz)" if gz else ""))


def read_bytes(path: str) -> bytes:
    """The content of ``path``, decompressed when it is gzip (by its magic bytes, not its suffix)."""
    try:
        with open(path, "rb") as f:
            data = f.read()
        if data[:2] == GZIP_MAGIC:
            data = gzip.decompress(data)
    except (EOFError, gzip.BadGzipFile, zlib.error) as e:
        raise DatasetError(f"{path}: corrupt or truncated gzip data ({e})") from None
    except OSError as e:
        raise DatasetError(f"{path}: cannot read ({e.strerror or e})") from None
    return data
