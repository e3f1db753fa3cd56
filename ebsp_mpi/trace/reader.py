"""Read a run's outputs back: trace files as numpy structured arrays (one file, or every rank of a
run), and ``summary.json`` checked for the fields the analysis reads.

Root attributes come back as Python values; an attribute stored as JSON (``<key>_json``, e.g. the
job config) comes back decoded under ``<key>``. Tables come back whole, as numpy structured arrays
with the dtypes of :mod:`ebsp_mpi.trace.schema`.

A run directory is read as far as it goes: a rank file that cannot be read, or that belongs to
another run (its ``run_id`` differs), is left out with a warning naming it. A simulation of many
workers keeps their iterations in one file (:data:`~ebsp_mpi.trace.schema.WORKERS_FILE`), read back as
one trace per worker rank.
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

from .schema import ITERATIONS, TABLES, WORKER_ITERATIONS, WORKERS_FILE

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
        """The resolved job config the run used (``{}`` if the file has none, or not as a JSON object)."""
        config = self.attrs.get("config")
        return config if isinstance(config, dict) else {}

    @property
    def run_id(self) -> str | None:
        return self.attrs.get("run_id")

    @property
    def rank(self) -> int | None:
        return self.attrs.get("rank")

    @property
    def role(self) -> str | None:
        return self.attrs.get("role")

    @property
    def world_size(self) -> int:
        """Ranks of the run as this file records them; 0 when it does not say (as an integer)."""
        size = self.attrs.get("world_size")
        return size if isinstance(size, int) and not isinstance(size, bool) and size > 0 else 0

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
    _check_tables(path, tables)
    return TraceFile(path=path, attrs=attrs, tables=tables)


def _check_tables(path: Path, tables: dict[str, np.ndarray]) -> None:
    """Raise :class:`TraceError` when a table of the schema lacks its fields: an HDF5 file of another
    program (or a later schema) would otherwise fail deep in the analysis with a KeyError."""
    for name, rows in tables.items():
        expected = TABLES.get(name)
        if expected is None:
            continue  # not ours to read; left as it is
        fields = rows.dtype.names or ()
        missing = [f for f in expected.names if f not in fields]
        if rows.ndim != 1 or missing:
            raise TraceError(f"{path}: table {name!r} is not one of this trace schema (fields {list(fields)}, "
                             f"shape {rows.shape}; expected one row per event with {list(expected.names)})")


def read_run(run_dir: str | os.PathLike, *, live: bool = False) -> dict[int, TraceFile]:
    """Read every rank's trace of a run: ``run_dir/trace/rank-NNNN.h5``, keyed by rank.

    A file that cannot be read is skipped with a warning naming it and the error, so a run with
    one damaged rank can still be analysed; so is a file of another run (its ``run_id`` differs from
    the run's, see :func:`_expected_run_id`) or of another rank (its ``rank`` attribute differs from
    its name), with a warning naming it and both ids. If no file is left, :class:`TraceError` is
    raised.

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
    files = _rank_files(trace_dir)
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
    if (trace_dir / WORKERS_FILE).is_file():
        try:
            for rank, trace in _worker_traces(trace_dir / WORKERS_FILE, live).items():
                traces.setdefault(rank, trace)
        except TraceError as err:
            errors.append(str(err))
            warnings.warn(f"skipping the workers' file: {err}", stacklevel=2)
    if not traces:
        raise TraceError(f"no readable trace file in {trace_dir}: " + "; ".join(errors))
    return _own_files(run_dir, traces)


def _worker_traces(path: Path, live: bool) -> dict[int, TraceFile]:
    """The workers' file of a simulation of many workers, as one trace per worker rank: its
    attributes, with the rank and role of each, and the worker's ``iterations`` (empty for a worker
    without any)."""
    whole = read_trace(path, live=live)
    rows = whole.tables.get("worker_iterations", np.zeros(0, dtype=WORKER_ITERATIONS))
    if set(WORKER_ITERATIONS.names) - set(rows.dtype.names or ()):
        raise TraceError(f"{path}: table 'worker_iterations' lacks the fields {list(WORKER_ITERATIONS.names)}")
    servers = int((whole.config.get("runtime") or {}).get("servers", 1))
    rows = rows[np.argsort(rows["worker"], kind="stable")]
    plain = np.empty(len(rows), dtype=ITERATIONS)
    for name in ITERATIONS.names:
        plain[name] = rows[name]
    bounds = np.searchsorted(rows["worker"], np.arange(max(whole.world_size - servers, 0) + 1))
    return {w + servers: TraceFile(path=path, attrs={**whole.attrs, "rank": w + servers, "role": "worker"},
                                   tables={"iterations": plain[bounds[w]:bounds[w + 1]]})
            for w in range(len(bounds) - 1)}


def _rank_files(trace_dir: Path) -> list[tuple[int, Path]]:
    """(rank, path) of each rank file, by rank. Where two names give one rank (``rank-1.h5`` beside
    ``rank-0001.h5``), the one the writer makes is read and the other left out with a warning: both
    would otherwise be read as that rank, the last silently replacing the first."""
    by_rank: dict[int, list[Path]] = {}
    for p in sorted(trace_dir.iterdir()):
        if (m := _RANK_FILE.match(p.name)) and p.is_file():
            by_rank.setdefault(int(m.group(1)), []).append(p)
    files = []
    for rank, paths in sorted(by_rank.items()):
        chosen = next((p for p in paths if p.name == f"rank-{rank:04d}.h5"), paths[0])
        for other in paths:
            if other != chosen:
                warnings.warn(f"leaving out {other}: {chosen.name} is rank {rank}'s file", stacklevel=3)
        files.append((rank, chosen))
    return files


def _expected_run_id(run_dir: Path, traces: dict[int, TraceFile]) -> tuple[str | None, str]:
    """The run id every rank file of ``run_dir`` must carry, and where it was read.

    ``summary.json``'s ``run_id`` where the summary has one (the server writes it last, so it names
    the run that finished here), else rank 0's file's, else the one most files carry (rank 0 missing
    or unreadable).
    """
    summary, _ = read_summary(run_dir)
    if isinstance(summary.get("run_id"), str):
        return summary["run_id"], str(run_dir / "summary.json")
    if 0 in traces:
        return traces[0].run_id, str(traces[0].path)
    ids = [t.run_id for _, t in sorted(traces.items())]
    most = max(dict.fromkeys(ids), key=ids.count)  # ties: the lowest rank's
    return most, f"{ids.count(most)} of the {len(ids)} readable rank files"


def _own_files(run_dir: Path, traces: dict[int, TraceFile]) -> dict[int, TraceFile]:
    """The rank files that belong to this run: a file copied from another run (another ``run_id``) or
    from another rank (its ``rank`` attribute differs from its name) would be merged into this run's
    tables as if it were this rank's, so it is left out with a warning naming it."""
    run_id, source = _expected_run_id(run_dir, traces)
    own: dict[int, TraceFile] = {}
    for rank, trace in sorted(traces.items()):
        if run_id is not None and trace.run_id != run_id:
            warnings.warn(f"leaving out {trace.path}: its run id is {trace.run_id!r}, this run's is {run_id!r} "
                          f"(from {source}); a rank file of another run?", stacklevel=3)
        elif trace.rank is not None and trace.rank != rank:
            warnings.warn(f"leaving out {trace.path}: it holds rank {trace.rank}'s trace, not rank {rank}'s",
                          stacklevel=3)
        else:
            own[rank] = trace
    if not own:
        raise TraceError(f"no trace file of run {run_id!r} (from {source}) in {run_dir / 'trace'}")
    return own


# -- summary.json ----------------------------------------------------------------------------------

_STRING, _NUMBER, _INTEGER, _OBJECT = ((str,), "a string"), ((int, float), "a number"), ((int,), "an integer"), \
    ((dict,), "an object")

#: Fields of ``summary.json`` the analysis reads: the JSON type each may have besides null.
_SUMMARY_TYPES = {
    "run_id": _STRING, "sync": _STRING, "workers": _INTEGER, "wall_seconds": _NUMBER, "test_accuracy": _NUMBER,
    "test_loss": _NUMBER, "samples_per_second": _NUMBER, "barriers": _INTEGER, "rejected_pushes": _INTEGER,
    "time_to_accuracy": _OBJECT, "config": _OBJECT,
}


def _summary_type_problem(doc: dict) -> str | None:
    """What in ``doc`` has a type the analysis cannot use, or None."""
    for key, (types, name) in _SUMMARY_TYPES.items():
        value = doc.get(key)
        # JSON true/false are Python bools, which are ints: not a count nor a number of seconds
        if value is not None and (isinstance(value, bool) or not isinstance(value, types)):
            return f"{key!r} is {json.dumps(value)[:40]}, expected {name} or null"
    for target, seconds in (doc.get("time_to_accuracy") or {}).items():
        try:
            float(target)
        except ValueError:
            return f"'time_to_accuracy' has the target {target!r}, expected a number such as \"0.95\""
        if seconds is not None and (isinstance(seconds, bool) or not isinstance(seconds, (int, float))):
            return f"'time_to_accuracy' of {target} is {json.dumps(seconds)[:40]}, expected seconds or null"
    return None


def read_summary(run_dir: str | os.PathLike) -> tuple[dict[str, Any], str | None]:
    """A run's ``summary.json``, and why it does not show a finished run.

    The server writes the summary when the run ends, so a summary whose ``wall_seconds`` is null or
    missing is the mark of a run that did not finish (a crash, or a summary written by hand).

    Parameters
    ----------
    run_dir : str or os.PathLike
        The run's output directory.

    Returns
    -------
    summary : dict
        The decoded object; ``{}`` when the file is missing, is not JSON, is not a JSON object, or a
        field the analysis reads has the wrong type (then nothing in it can be trusted).
    problem : str or None
        None for a finished run's summary; else one sentence naming the path and what is wrong.
    """
    path = Path(run_dir) / "summary.json"
    if not path.is_file():
        what = "not a file" if path.exists() else "missing"
        return {}, f"{path}: {what} (the run did not finish?)"
    try:
        doc = json.loads(path.read_text())
    except (OSError, ValueError) as err:
        return {}, f"{path}: unreadable ({err})"
    if not isinstance(doc, dict):
        return {}, f"{path}: not a JSON object but {type(doc).__name__} (not a summary.json?)"
    wrong = _summary_type_problem(doc)
    if wrong:
        return {}, f"{path}: {wrong}"
    if doc.get("wall_seconds") is None:
        return doc, f"{path}: no wall time (wall_seconds is null or missing): the run did not finish"
    return doc, None
