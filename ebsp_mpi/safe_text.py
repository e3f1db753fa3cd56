"""Text that came from outside the program, made fit for HDF5 attributes and JSON files.

Library versions, host and device names, paths and job text reach the outputs (trace attributes,
``model.h5``, ``summary.json``, sweep manifests, timelines, plans) as they were given. Some are not
fit to be stored: Open MPI's ``MPI_Get_library_version`` ends with the C string's NUL byte, which HDF5
refuses in a string attribute (``VLEN strings do not support embedded NULLs``); a file name or a host
name may hold bytes that are not UTF-8 (Python carries them as lone surrogates, which HDF5 cannot
encode and strict JSON readers refuse); and one runaway value (a file read where a name was meant)
would be copied whole into every rank's trace. :func:`clean_text` is the one rule for all of them, and
every such output passes its strings through it (:func:`clean_tree` for nested values).

Values read from outside go through one strict rule each, here too: :func:`ascii_digits` for a count
or a rank in an environment variable or option (``str.isdigit`` accepts ``'²'``, which ``int`` then
refuses with a traceback), and :func:`path_label` for a job name that becomes part of a file name.
Standard library only.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from typing import Any

#: Characters of one string kept in an output; the rest is replaced by a note of how many there were.
#: Longer than any path (Linux's PATH_MAX is 4096 bytes) or any library's version line.
MAX_CHARS = 8192
#: characters of a job name kept in a run directory's default name (with its timestamp, well under the
#: 255 bytes a file name may have)
LABEL_CHARS = 64


def ascii_digits(text: str) -> bool:
    """True when `text` is one or more ASCII digits 0-9, the only digits a count or rank is read from."""
    return text.isascii() and text.isdigit()


def integer(text: str) -> int:
    """An option's whole number, of ASCII digits with an optional sign (``int`` takes ``'٣'`` as 3):
    an argparse ``type``."""
    if not (text.isascii() and re.fullmatch(r"\s*[-+]?\d+\s*", text)):
        raise ValueError(text)
    return int(text)


def number(text: str) -> float:
    """An option's number, written in ASCII (``float`` takes ``'٥'`` as 5.0): an argparse ``type``."""
    if not text.isascii():
        raise ValueError(text)
    return float(text)


def directory(text: str) -> str:
    """An option's directory: not empty nor blank (``--out ""`` would otherwise mean the default
    directory, silently): an argparse ``type``."""
    if not text.strip():
        raise ValueError(text)
    return text


def path_label(name: str) -> str:
    """`name` (a job's ``name``: a label) as a part of a file name: letters, digits, ``.``, ``_`` and
    ``-`` kept, any run of other characters (``/``, NUL, spaces, non-ASCII) one ``_``, at most
    :data:`LABEL_CHARS` characters, never empty or a dot alone; it cannot leave the directory it is
    put in, nor be refused by a file system."""
    label = re.sub(r"[^A-Za-z0-9._-]+", "_", name)[:LABEL_CHARS].strip("_")
    return label if label.strip(".") else "run"


def clean_text(value: str | bytes, limit: int | None = MAX_CHARS) -> str:
    """`value` as a string that HDF5 and strict JSON accept, still readable:

    - NUL bytes at the end (a C string's terminator) are dropped; a NUL inside is written ``\\x00``;
    - bytes that are not UTF-8 (given as bytes, or carried in a ``str`` as lone surrogates, as Python
      decodes file names, ``argv`` and the environment) are written as ``\\xNN``;
    - beyond `limit` characters (None: no limit, for a whole file) the text is cut and ends with
      ``... [N more characters]``.

    Text that is already clean comes back unchanged.
    """
    if isinstance(value, (bytes, bytearray, memoryview)):
        raw = bytes(value)
    else:
        text = str(value)
        try:
            raw = text.encode("utf-8", "surrogateescape")  # undoes Python's decoding of non-UTF-8 bytes
        except UnicodeEncodeError:  # a lone surrogate that no decoding made: keep its code point's bytes
            raw = text.encode("utf-8", "surrogatepass")
    text = raw.rstrip(b"\0").decode("utf-8", "backslashreplace").replace("\0", "\\x00")
    if limit is not None and len(text) > limit:
        text = f"{text[:limit]}... [{len(text) - limit} more characters]"
    return text


def clean_tree(value: Any, limit: int = MAX_CHARS) -> Any:
    """`value` with :func:`clean_text` applied to every string, bytes and path in it (a path becomes
    a string), dictionary keys included; dicts, lists and tuples are walked (tuples become lists), and
    anything else is kept."""
    if isinstance(value, (str, bytes, bytearray)):
        return clean_text(value, limit)
    if isinstance(value, os.PathLike):
        return clean_text(os.fspath(value), limit)
    if isinstance(value, Mapping):
        return {(clean_text(k, limit) if isinstance(k, (str, bytes)) else k): clean_tree(v, limit)
                for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [clean_tree(v, limit) for v in value]
    return value
