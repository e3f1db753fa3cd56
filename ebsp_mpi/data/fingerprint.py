"""The identity of a job's dataset files: a fingerprint cheap on a large file that still catches a
replaced one (docs/reliability.md, "Run identity").

A file's fingerprint is the SHA-256 of its size and of :data:`BLOCKS` blocks of :data:`BLOCK_BYTES`
at fixed fractions of it (the first and the last included); a file of up to ``BLOCKS * BLOCK_BYTES``
bytes (1 MiB) is hashed whole. Size and modification time would not do: a file replaced by another of
the same size (a re-download, another shuffle of the same samples) keeps its size, and a copy gets a
new time. What the fingerprint does not see is an edit confined to bytes between the sampled blocks
of a file above 1 MiB; a compressed file (``.gz``) spreads any change of its contents over the rest
of it, so there it is caught too. At most 1 MiB is read per file, whatever its size.

The embedded default dataset (``digits``, scikit-learn's ``digits.csv.gz``) is a file like the others;
``synthetic`` has none (its samples follow from the job, whose fingerprint covers them).
Standard library only.
"""

from __future__ import annotations

import hashlib
import os

#: blocks sampled per file, and their size (bytes)
BLOCKS = 16
BLOCK_BYTES = 64 * 1024


def file_fingerprint(path: str) -> str:
    """``<size>:<16 hex digits>`` of the file at `path` (see the module docstring); ``missing`` or
    ``unreadable`` when it cannot be read (the dataset's loader then says why, in one line). Only a
    regular file is read: a FIFO would block the open, and ``/dev/zero`` never end."""
    if not os.path.isfile(path):
        return "missing"
    try:
        with open(path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            digest = hashlib.sha256(str(size).encode())
            if size <= BLOCKS * BLOCK_BYTES:
                digest.update(f.read())
            else:
                last = size - BLOCK_BYTES
                for k in range(BLOCKS):
                    f.seek(last * k // (BLOCKS - 1))
                    digest.update(f.read(BLOCK_BYTES))
    except FileNotFoundError:
        return "missing"
    except OSError:
        return "unreadable"
    return f"{size}:{digest.hexdigest()[:16]}"


def dataset_files(name: str, root: str, path: str) -> list[str]:
    """The files dataset `name` reads (``data.name``, ``data.root``, ``data.path``), in a fixed order;
    none for ``synthetic``. A file that is not there is listed where it is looked for first."""
    if name == "hdf5":
        return [os.path.abspath(path)] if path else []
    if name == "digits":
        from .digits import digits_path
        from .errors import DatasetError

        try:
            return [digits_path()]
        except DatasetError:
            return []
    directory = os.path.abspath(os.path.expanduser(root)) if root else ""
    if name in ("mnist", "fashion-mnist"):
        from .idx import EXPECTED
    elif name == "cifar10":
        from .cifar import EXPECTED, SUBDIR

        nested = os.path.join(directory, SUBDIR)
        if not os.path.isfile(os.path.join(directory, EXPECTED[0])) and os.path.isdir(nested):
            directory = nested
    else:
        return []
    files = []
    for base in EXPECTED:
        plain = os.path.join(directory, base)
        files.append(plain if os.path.isfile(plain) or not os.path.isfile(plain + ".gz") else plain + ".gz")
    return files


def dataset_fingerprint(name: str, root: str = "", path: str = "") -> dict[str, str]:
    """File name -> :func:`file_fingerprint`, for every file the dataset reads (empty for
    ``synthetic``)."""
    return {file: file_fingerprint(file) for file in dataset_files(name, root, path)}
