"""Per-rank HDF5 trace writer: rows buffered in memory, written in chunks, flushed on a timer or when a
table's buffer is full.

What a rank holds for its trace never grows with the run: each table's buffer has a fixed number of
rows (:data:`_BUFFER_ROWS`, allocated when the writer is made), and a full one is flushed instead of
grown. Rows are written through h5py's low-level calls on dataspaces and types made once per table
(:class:`_Table`): the high-level ``dataset[a:b] = rows`` left some 150 bytes of cyclic garbage per
flush, and every h5py object made and dropped churns h5py's registry of objects, which grows in steps
of some 5 KB; an OSDP worker's measured peak counted both as growth with the run's length.

File settings, and why:

- ``libver=("earliest", "v108")``: the file keeps superblock version 0-2, which has no "file is open for
  write" status flag. With ``libver="latest"`` (superblock 3) or SWMR, a writer killed with SIGKILL
  leaves that flag set and HDF5 then refuses to open the file until ``h5clear -s`` is run. With these
  settings a killed rank's file opens as it was at the last :meth:`TraceWriter.flush`.
- No SWMR: a reader needs no special mode, and only one process writes each file.
- File locking ``"best-effort"``: the writer holds HDF5's exclusive lock while it lives (a second
  writer of the same path, e.g. two runs given the same ``--out``, fails at once), but filesystems
  without ``flock`` (some Lustre/NFS mounts) do not make the run fail. A reader of a *live* file must
  open it without locking (``read_trace(path, live=True)``, ``h5py.File(path, "r", locking=False)``
  or ``HDF5_USE_FILE_LOCKING=FALSE``); it then sees the rows up to the writer's last flush. The kernel
  drops the lock when a process dies, so a killed rank leaves no stale lock.

Between flushes the writer makes no HDF5 call, so the bytes on disk stay exactly those of the last
flush; a process killed then leaves a consistent file. A kill *during* a flush may lose that flush.
"""

from __future__ import annotations

import json
import operator
import os
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import h5py
import numpy as np
from h5py import h5s, h5t

from ..errors import OutputError
from ..safe_text import clean_text, clean_tree
from .schema import SCHEMA_VERSION, TABLES

#: Rows a table's in-memory buffer holds; a full buffer is flushed (with every other table's rows).
_BUFFER_ROWS = 1024
#: Target bytes of one HDF5 chunk of a table.
_CHUNK_BYTES = 64 * 1024
_LIBVER = ("earliest", "v108")


def _chunk_rows(dtype: np.dtype) -> int:
    """Rows of one HDF5 chunk of a table of `dtype`: about :data:`_CHUNK_BYTES`, at least 64."""
    return max(64, _CHUNK_BYTES // dtype.itemsize)


def trace_path(out_dir: str | os.PathLike, rank: int) -> Path:
    """Path of rank ``rank``'s trace file in the run directory ``out_dir``: ``out_dir/trace/rank-NNNN.h5``."""
    if rank < 0:
        raise ValueError(f"rank must be >= 0, got {rank}")
    return Path(out_dir) / "trace" / f"rank-{rank:04d}.h5"


def _attr_value(key: str, value: Any) -> tuple[str, Any]:
    """Map one root attribute to the (name, value) HDF5 stores.

    Booleans, numbers and numeric arrays are stored as they are, strings (and bytes) through
    :func:`~ebsp_mpi.safe_text.clean_text` (HDF5 refuses a NUL or bytes that are not UTF-8 in a
    string attribute); anything else (a nested dict such as the job config, a list, None) is
    stored as a JSON string under ``<key>_json``, its strings cleaned the same way.
    """
    if isinstance(value, (str, bytes)):  # numpy.str_ and numpy.bytes_ too
        return key, clean_text(value)
    if isinstance(value, (bool, int, float, np.generic)):
        return key, value
    if isinstance(value, np.ndarray) and value.dtype.kind in "biuf":
        return key, value
    try:
        text = json.dumps(clean_tree(value), sort_keys=True)
    except (TypeError, ValueError) as err:
        raise TypeError(
            f"trace attribute {key!r}: cannot store a value of type {type(value).__name__} "
            f"(expected str, number, bool, numeric array or JSON-serializable data): {err}"
        ) from None
    return (key if key.endswith("_json") else f"{key}_json"), text


class _TableBuffer:
    """Rows of one table waiting to be written: a structured array of fixed length and a fill count."""

    __slots__ = ("count", "dtype", "names", "row_of", "rows")

    def __init__(self, dtype: np.dtype):
        self.dtype = dtype
        self.names = dtype.names
        # keyword fields -> the row tuple in field order, in C (the server appends rows per push)
        getter = operator.itemgetter(*self.names)
        self.row_of = getter if len(self.names) > 1 else (lambda fields: (getter(fields),))
        self.rows = np.zeros(_BUFFER_ROWS, dtype=dtype)
        self.count = 0


class _Table:
    """A table's dataset in the file, the dataspace that selects where the next rows go, and its length
    (kept here: asking the dataset makes a new h5py object)."""

    __slots__ = ("dataset", "rows", "space")

    def __init__(self, dataset: h5py.Dataset):
        self.dataset = dataset
        self.space = dataset.id.get_space()
        self.rows = int(self.space.shape[0])

    def resize(self, rows: int) -> None:
        self.dataset.id.set_extent((rows,))
        self.space.set_extent_simple((rows,), (h5s.UNLIMITED,))
        self.rows = rows


def encode_attrs(attrs: Mapping[str, Any]) -> dict[str, Any]:
    """Root attributes as a trace file stores them (:func:`_attr_value`), with the schema version:
    what :class:`TraceWriter` writes, worked out once for files written whole by :func:`write_whole`."""
    encoded = {"trace_schema_version": SCHEMA_VERSION}
    for key, value in attrs.items():
        name, stored = _attr_value(key, value)
        encoded[name] = stored
    return encoded


def write_whole(path: str | os.PathLike, encoded_attrs: Mapping[str, Any], tables: Mapping[str, np.ndarray]) -> None:
    """Write a trace file in one go, as a :class:`TraceWriter` would leave it: the root attributes
    (from :func:`encode_attrs`) and each table that has rows, chunked as the writer chunks. For the
    simulator, which writes a thousand files at once: one open each, and the job's attributes
    encoded once instead of per file."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with h5py.File(path, "w", libver=_LIBVER) as f:
        for name, stored in encoded_attrs.items():
            f.attrs[name] = stored
        for name, rows in tables.items():
            if len(rows):
                f.create_dataset(name, data=rows, maxshape=(None,), chunks=(min(_chunk_rows(rows.dtype), len(rows)),))


class TraceWriter:
    """Writes one rank's trace: root attributes and the event tables of :data:`schema.TABLES`.

    Parameters
    ----------
    path : str or os.PathLike
        The file to create (truncated if it exists); parent directories are created.
    attrs : dict
        Root attributes (see :data:`schema.ROOT_ATTRS`). Numbers are stored as they are, strings
        cleaned (:mod:`ebsp_mpi.safe_text`); a nested dict (the resolved job config under ``config``)
        is stored as a JSON string attribute ``config_json``.
    flush_seconds : float
        :meth:`maybe_flush` writes the buffered rows when at least this many seconds (monotonic
        clock) passed since the last flush. This bounds what a crash can lose.
    tables : mapping of str to numpy.dtype, optional
        The tables this writer accepts; default :data:`schema.TABLES`.

    Notes
    -----
    :meth:`append` only copies the row into a preallocated in-memory array (no HDF5 call, except the
    flush of a full buffer), so it is cheap enough for the server's message loop. Tables are created
    on first flush of a row as chunked datasets with ``maxshape=(None,)``. The file is readable after
    a SIGKILL up to the last flush; see the module docstring for the HDF5 settings that make this so.
    """

    def __init__(
        self,
        path: str | os.PathLike,
        attrs: Mapping[str, Any],
        flush_seconds: float = 2.0,
        *,
        tables: Mapping[str, np.dtype] | None = None,
        append: bool = False,
    ):
        if not flush_seconds >= 0:
            raise ValueError(f"flush_seconds must be >= 0 seconds, got {flush_seconds!r}")
        self.path = Path(path)
        self.flush_seconds = float(flush_seconds)
        self._schema = dict(TABLES if tables is None else tables)
        self._buffers = {name: _TableBuffer(np.dtype(dt)) for name, dt in self._schema.items()}
        self._datasets: dict[str, _Table] = {}
        # where a flush's rows come from in a buffer (its first `count` rows selected), and their HDF5 types
        self._memory = h5s.create_simple((_BUFFER_ROWS,))
        self._types = {name: h5t.py_create(buf.dtype) for name, buf in self._buffers.items()}
        self.path.parent.mkdir(parents=True, exist_ok=True)
        mode = "a" if append and self.path.exists() else "w"
        try:
            self._file = h5py.File(self.path, mode, libver=_LIBVER, locking="best-effort")
        except OSError as e:
            reason = os.strerror(e.errno) if e.errno else str(e).splitlines()[0]
            raise OutputError(f"cannot open the trace {self.path} for writing: {reason}") from None
        if mode == "a":
            self._adopt_tables()
        self._closed = False
        self.set_attrs(trace_schema_version=SCHEMA_VERSION, **dict(attrs))
        # Flush at once so that even a rank killed before its first timed flush leaves a file
        # that opens, with its attributes.
        self.flush()

    def _adopt_tables(self) -> None:
        """Append to the tables a file already holds (a resumed run continues its traces)."""
        for name, ds in self._file.items():
            if name in self._buffers:
                if ds.dtype != self._buffers[name].dtype:
                    raise OutputError(f"{self.path}: table {name!r} has columns {ds.dtype.names}, expected "
                                      f"{self._buffers[name].names}: not a trace of this version")
                self._datasets[name] = _Table(ds)

    def truncate(self, table: str, column: str, limit: float) -> int:
        """Keep the leading rows of `table` (as written so far) whose `column` is at most `limit`, and
        drop the rest: a resumed run removes what it will do again. Returns the rows kept."""
        self.flush()
        written = self._datasets.get(table)
        if written is None:
            return 0
        beyond = np.flatnonzero(written.dataset[column] > limit)
        kept = int(beyond[0]) if beyond.size else written.rows
        written.resize(kept)
        return kept

    def mark_lost(self, table: str, column: str, resumed_at: int) -> tuple[int, int] | None:
        """After :meth:`truncate` on a resume: record the counts of `column` (a 0-based count such as
        ``iteration``) that have no row in `table` although the run resumes at `resumed_at`.

        A run killed after its checkpoint counted some iterations and before this rank flushed their
        rows loses those rows: the work was done (the checkpoint's model has it), so it is not done
        again, and the rank's table would jump over it. The gap goes into the root attribute
        ``lost_<table>``, a list of ``[first, last]`` pairs (one per resume that lost rows), which
        readers report, instead of a gap nothing explains. Returns the pair, or None when nothing
        was lost."""
        self.flush()
        written = self._datasets.get(table)
        last = int(written.dataset[column][written.rows - 1]) if written is not None and written.rows else -1
        if last >= resumed_at - 1:
            return None
        key = f"lost_{table}"
        stored = self._file.attrs.get(f"{key}_json")
        pairs = (json.loads(stored) if stored is not None else []) + [[last + 1, int(resumed_at) - 1]]
        self.set_attrs(**{key: pairs})
        return last + 1, int(resumed_at) - 1

    # -- rows -------------------------------------------------------------------------------------

    def append(self, table: str, row: tuple | None = None, /, **fields: Any) -> None:
        """Buffer one row of ``table``, given as a tuple in field order or as keyword fields.

        No HDF5 call is made; rows reach the file at the next :meth:`flush`.
        """
        try:
            buf = self._buffers[table]
        except KeyError:
            raise ValueError(
                f"unknown trace table {table!r}; expected one of {sorted(self._buffers)}"
            ) from None
        if self._closed:
            raise ValueError(f"trace writer for {self.path} is closed")
        if row is None:
            row = self._row_from_fields(table, buf, fields)
        elif fields:
            raise TypeError("append: give the row as a tuple or as keyword fields, not both")
        if buf.count == len(buf.rows):
            self.flush()  # instead of a larger buffer: the memory stays what it was at the start
        buf.rows[buf.count] = row
        buf.count += 1

    @staticmethod
    def _row_from_fields(table: str, buf: _TableBuffer, fields: dict[str, Any]) -> tuple:
        names = buf.names
        try:
            row = buf.row_of(fields)
        except KeyError as err:
            raise ValueError(
                f"trace table {table!r}: missing field {err.args[0]!r}; fields are {list(names)}"
            ) from None
        if len(fields) != len(names):
            extra = sorted(set(fields) - set(names))
            raise ValueError(f"trace table {table!r}: unknown fields {extra}; fields are {list(names)}")
        return row

    def pending(self, table: str) -> int:
        """Rows of ``table`` buffered and not yet written."""
        return self._buffers[table].count

    # -- attributes -------------------------------------------------------------------------------

    def set_attrs(self, **attrs: Any) -> None:
        """Set root attributes (e.g. ``clock_offset_s`` once measured); written at the next flush."""
        if self._closed:
            raise ValueError(f"trace writer for {self.path} is closed")
        for key, value in attrs.items():
            name, stored = _attr_value(key, value)
            self._file.attrs[name] = stored

    # -- flushing ---------------------------------------------------------------------------------

    def maybe_flush(self) -> bool:
        """Flush if ``flush_seconds`` passed since the last flush; return whether it flushed."""
        if time.monotonic() - self._last_flush >= self.flush_seconds:
            self.flush()
            return True
        return False

    def flush(self) -> None:
        """Write every buffered row and flush the HDF5 file to disk.

        Raises
        ------
        OutputError
            When the file cannot be written (a full disk, a quota): one line for the user, naming it.
        """
        if self._closed:
            return
        try:
            for name, buf in self._buffers.items():
                if buf.count:
                    self._write_rows(name, buf)
            self._file.flush()
        except OSError as e:  # h5py's write errors are OSErrors that carry HDF5's whole error stack
            reason = os.strerror(e.errno) if e.errno else str(e).splitlines()[0]
            raise OutputError(f"cannot write the trace {self.path}: {reason}") from None
        self._last_flush = time.monotonic()

    def _write_rows(self, name: str, buf: _TableBuffer) -> None:
        written = self._datasets.get(name)
        if written is None:
            written = self._datasets[name] = _Table(self._file.create_dataset(
                name, shape=(0,), maxshape=(None,), chunks=(_chunk_rows(buf.dtype),), dtype=buf.dtype))
        # low-level calls on objects made once (see the module docstring)
        start, count = written.rows, buf.count
        written.resize(start + count)
        written.space.select_hyperslab((start,), (count,))
        self._memory.select_hyperslab((0,), (count,))
        written.dataset.id.write(self._memory, written.space, buf.rows, mtype=self._types[name])
        buf.count = 0

    def close(self) -> None:
        """Flush and close the file. Safe to call more than once."""
        if self._closed:
            return
        try:
            self.flush()
        finally:
            self._closed = True
            self._datasets.clear()
            self._file.close()

    @property
    def closed(self) -> bool:
        return self._closed

    def __enter__(self) -> TraceWriter:
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "closed" if self._closed else "open"
        return f"TraceWriter({str(self.path)!r}, {state})"


class NullTrace:
    """Stands in for a :class:`TraceWriter` when tracing is off (``trace.enabled = false``)."""

    def append(self, *args: Any, **kwargs: Any) -> None:
        pass

    def truncate(self, *args: Any) -> int:
        return 0

    def mark_lost(self, *args: Any) -> None:
        return None

    def set_attrs(self, **attrs: Any) -> None:
        pass

    def maybe_flush(self) -> bool:
        return False

    def flush(self) -> None:
        pass

    def close(self) -> None:
        pass


def open_trace(out_dir: str | os.PathLike, rank: int, attrs: dict, *, enabled: bool = True,
               flush_seconds: float = 2.0, append: bool = False) -> TraceWriter | NullTrace:
    """The trace of `rank` in the run directory `out_dir`, or a :class:`NullTrace` when disabled; with
    `append`, the rank's existing file is continued (a resumed run)."""
    if not enabled:
        return NullTrace()
    return TraceWriter(trace_path(out_dir, rank), attrs, flush_seconds=flush_seconds, append=append)
