"""Read trace files back as numpy structured arrays (one file, or every rank of a run).

Root attributes come back as Python values; an attribute stored as JSON (``<key>_json``, e.g. the
job config) comes back decoded under ``<key>``. Tables come back whole, as numpy structured arrays
with the dtypes of :mod:`ebsp_mpi.trace.schema`.
"""

from __future__ import annotations

import json
import os
import re
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import h5py
import numpy as np

from .schema import TABLES

_RANK_FILE = re.compile(r"^rank-(\d+)\.h5$")


class TraceError(ValueError):
    """A trace file or run directory is missing or cannot be read; the message names the path."""


@dataclass
class TraceFile:
    """One rank's trace.

    Attributes
    ----------
    path : pathlib.Path
    attrs : dict
        Root attributes; JSON-stored ones decoded (``config_json`` becomes ``attrs["config"]``).
    tables : dict of str to numpy.ndarray
        The tables present in the file (a table with no rows is absent; see :meth:`table`).
    """

    path: Path
    attrs: dict[str, Any] = field(default_factory=dict)
    tables: dict[str, np.ndarray] = field(default_factory=dict)

    @property
    def config(self) -> dict[str, Any]:
        """The resolved job config the run used (``{}`` if the file has none)."""
        return self.attrs.get("config") or {}

    @property
    def rank(self) -> int | None:
        return self.attrs.get("rank")

    @property
    def role(self) -> str | None:
        return self.attrs.get("role")

    def table(self, name: str) -> np.ndarray:
        """Table ``name``, or an empty array of its schema dtype if the file has no rows of it."""
        if name in self.tables:
            return self.tables[name]
        if name in TABLES:
            return np.zeros(0, dtype=TABLES[name])
        raise KeyError(f"{self.path}: no table {name!r}; known tables are {sorted(TABLES)}")


def _python_value(value: Any) -> Any:
    if isinstance(value, bytes):
        return value.decode("utf-8")
    if isinstance(value, np.generic):
        return value.item()
    return value


def _decode_attrs(path: Path, raw: h5py.AttributeManager) -> dict[str, Any]:
    attrs: dict[str, Any] = {}
    for key in raw:
        value = _python_value(raw[key])
        if key.endswith("_json") and isinstance(value, str):
            try:
                attrs[key[: -len("_json")]] = json.loads(value)
                continue
            except json.JSONDecodeError as err:
                raise TraceError(f"{path}: attribute {key!r} is not valid JSON: {err}") from None
        attrs[key] = value
    return attrs


def _open(path: Path, live: bool) -> h5py.File:
    if not live:
        return h5py.File(path, "r", locking="best-effort")
    try:
        # Another process's writer holds HDF5's lock: read without taking one.
        return h5py.File(path, "r", locking=False)
    except OSError as err:
        if "flag values don't match" not in str(err):
            raise
    # The writer is in this process: HDF5 shares its open file only with the same lock settings.
    return h5py.File(path, "r", locking="best-effort")


def read_trace(path: str | os.PathLike, *, live: bool = False) -> TraceFile:
    """Read one rank's trace file.

    Parameters
    ----------
    path : str or os.PathLike
    live : bool
        Open without HDF5 file locking, to read a file a running rank still writes (its rows up
        to the last flush). A read that races a flush can fail; read again. Without it, a file
        another process still writes fails with a hint to pass ``live=True``.

    Raises
    ------
    TraceError
        If the file does not exist or is not a readable HDF5 file (e.g. truncated), naming the path.
    """
    path = Path(path)
    if not path.is_file():
        raise TraceError(f"trace file not found: {path}")
    try:
        h5 = _open(path, live)
    except OSError as err:
        hint = (
            "; is a running rank still writing it? read it with live=True"
            if "unable to lock file" in str(err) and not live
            else " (truncated, or not an HDF5 file?)"
        )
        raise TraceError(f"cannot open trace file {path}: {err}{hint}") from None
    try:
        with h5:
            attrs = _decode_attrs(path, h5.attrs)
            tables = {name: obj[()] for name, obj in h5.items() if isinstance(obj, h5py.Dataset)}
    except TraceError:
        raise
    except (OSError, KeyError, ValueError, RuntimeError) as err:
        raise TraceError(f"cannot read trace file {path}: {err} (damaged file?)") from None
    return TraceFile(path=path, attrs=attrs, tables=tables)


def read_run(run_dir: str | os.PathLike, *, live: bool = False) -> dict[int, TraceFile]:
    """Read every rank's trace of a run: ``run_dir/trace/rank-NNNN.h5``, keyed by rank.

    A file that cannot be read is skipped with a warning naming it and the error, so a run with
    one damaged rank can still be analysed; if no file can be read, :class:`TraceError` is raised.

    Parameters
    ----------
    run_dir : str or os.PathLike
        The run's output directory (``--out``).
    live : bool
        As in :func:`read_trace`.
    """
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise TraceError(f"run directory not found: {run_dir}")
    trace_dir = run_dir / "trace"
    if not trace_dir.is_dir():
        raise TraceError(f"no trace directory in run {run_dir}: expected {trace_dir}")
    files = sorted(
        (int(m.group(1)), p)
        for p in trace_dir.iterdir()
        if (m := _RANK_FILE.match(p.name)) and p.is_file()
    )
    if not files:
        raise TraceError(f"no trace files (rank-NNNN.h5) in {trace_dir}")
    traces: dict[int, TraceFile] = {}
    errors = []
    for rank, path in files:
        try:
            traces[rank] = read_trace(path, live=live)
        except TraceError as err:
            errors.append(str(err))
            warnings.warn(f"skipping rank {rank}: {err}", stacklevel=2)
    if not traces:
        raise TraceError(f"no readable trace file in {trace_dir}: " + "; ".join(errors))
    return traces
