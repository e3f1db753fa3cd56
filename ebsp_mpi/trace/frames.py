"""A run directory as pandas DataFrames: one per trace table, plus the run's metadata.

This is the layer the analysis scripts build on (``analysis/*.py``, :mod:`ebsp_mpi.analysis`). pandas is
an optional extra (``pip install -e '.[analysis]'``) and is imported here only.

Every frame has a ``rank`` column (the rank whose file the row came from: 0 for the server's tables) and
all times are seconds since the run start on rank 0's clock, as the writer stores them. ``worker``
columns hold the worker index k (MPI rank k + runtime.servers). Worker iteration rows get the phase durations an
analysis needs (``compute_s``, ``delay_s``, ``push_s``, ``wait_s``, ``iteration_s``).

A damaged run is read as far as it goes: a missing or truncated rank file, a rank file of another run,
a missing rank, or a missing, unreadable or unfinished ``summary.json`` becomes one line in
:attr:`RunFrames.problems` (also issued as a warning), and the tables hold whatever the readable files
had.
"""

from __future__ import annotations

import os
import warnings
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from .reader import TraceError, read_run, read_summary
from .schema import TABLES, WORKER_TABLES


def _pandas():
    try:
        import pandas
    except ImportError as err:  # pragma: no cover - the extra is installed where tests run
        raise ImportError("ebsp_mpi.trace.frames needs pandas: pip install -e '.[analysis]'") from err
    return pandas


@dataclass
class RunFrames:
    """One run read for analysis.

    Attributes
    ----------
    path : pathlib.Path
        The run directory.
    summary : dict
        ``summary.json`` of a finished run (``{}`` when it is missing, unreadable or from a run that did
        not finish: see :func:`~ebsp_mpi.trace.reader.read_summary`).
    config : dict
        The resolved job config (from the summary, else from any rank's trace attributes).
    attrs : dict of int to dict
        Root attributes of each readable rank file.
    tables : dict of str to pandas.DataFrame
        Every table of :data:`ebsp_mpi.trace.schema.TABLES`, concatenated over ranks (empty frames
        with the schema's columns where no rank wrote rows).
    problems : list of str
        What could not be read, one sentence each naming the file.
    """

    path: Path
    summary: dict = field(default_factory=dict)
    config: dict = field(default_factory=dict)
    attrs: dict = field(default_factory=dict)
    tables: dict = field(default_factory=dict)
    problems: list = field(default_factory=list)

    def table(self, name: str):
        """The frame of table ``name`` (see :data:`ebsp_mpi.trace.schema.TABLES`)."""
        try:
            return self.tables[name]
        except KeyError:
            raise KeyError(f"{self.path}: no table {name!r}; known tables are {sorted(TABLES)}") from None

    @property
    def sync(self) -> str:
        """The sync model's name (``bsp``, ``asp``, ``ssp``, ``dssp``, ``elasticbsp``)."""
        return self.summary.get("sync") or self.config.get("sync", {}).get("model", "?")

    @property
    def seed(self) -> int | None:
        return self.config.get("seed")

    @property
    def world_size(self) -> int | None:
        sizes = {a.get("world_size") for a in self.attrs.values()}
        sizes = {n for n in sizes if isinstance(n, int) and not isinstance(n, bool) and n > 0}
        if sizes:
            return max(sizes)
        workers = self.summary.get("workers")
        return workers + self.servers if workers else None

    @property
    def servers(self) -> int:
        """Server ranks (``runtime.servers``): ranks 0..servers-1; the workers follow them."""
        return servers_of(self.config)

    @property
    def workers(self) -> int:
        """Number of workers (world size − servers), or the largest worker index seen + 1."""
        if self.summary.get("workers"):
            return int(self.summary["workers"])
        if self.world_size:
            return self.world_size - self.servers
        it = self.tables.get("iterations")
        return int(it["worker"].max()) + 1 if it is not None and len(it) else 0

    @property
    def wall_seconds(self) -> float:
        """Run length in seconds: the summary's, else the last time any table recorded."""
        if self.summary.get("wall_seconds") is not None:
            return float(self.summary["wall_seconds"])
        ends = [self.tables["iterations"]["t_end"].max(), self.tables["pushes"]["t"].max(),
                self.tables["evals"]["t"].max()]
        ends = [float(t) for t in ends if t == t]  # NaN of an empty table
        return max(ends) if ends else 0.0


def to_frame(rows, rank: int):
    """A structured numpy array of trace rows as a DataFrame with a leading ``rank`` column."""
    pd = _pandas()
    frame = pd.DataFrame({name: rows[name] for name in rows.dtype.names})
    frame.insert(0, "rank", rank)
    return frame


def _concat(pieces: list):
    """One frame of the ``(rank, rows)`` pieces of a table: rows of one dtype joined first (a simulation
    of 100,000 workers has as many pieces, and a DataFrame each would take minutes), else frame by frame."""
    pd = _pandas()
    if len({rows.dtype for _, rows in pieces}) == 1:
        frame = to_frame(np.concatenate([rows for _, rows in pieces]), 0)
        frame["rank"] = np.repeat([rank for rank, _ in pieces], [len(rows) for _, rows in pieces])
        return frame
    return pd.concat([to_frame(rows, rank) for rank, rows in pieces], ignore_index=True)


def _empty(name: str):
    pd = _pandas()
    dtype = TABLES[name]
    frame = pd.DataFrame({n: pd.Series(dtype=dtype[n]) for n in dtype.names})
    frame.insert(0, "rank", pd.Series(dtype="int64"))
    return frame


def servers_of(config: dict) -> int:
    """Server ranks of a run whose resolved job config is `config` (``runtime.servers``): ranks
    0..servers-1 are servers and worker w is rank w + servers; 1 when the config does not say."""
    return int((config.get("runtime") or {}).get("servers", 1))


def _with_phases(it, servers: int):
    """Worker iteration rows with the worker index (rank − servers) and the duration of each phase
    (seconds).

    ``t_start → t_compute_end`` holds the real compute and then the injected straggler sleep, so the
    real compute is that span minus ``injected_delay_s``.
    """
    it = it.copy()
    it.insert(1, "worker", it["rank"] - servers)
    span = it["t_compute_end"] - it["t_start"]
    it["delay_s"] = it["injected_delay_s"]
    it["compute_s"] = (span - it["injected_delay_s"]).clip(lower=0.0)
    it["push_s"] = it["t_push"] - it["t_compute_end"]
    it["iteration_s"] = it["t_end"] - it["t_start"]
    return it.sort_values(["worker", "iteration"], kind="stable").reset_index(drop=True)


def _read_summary(run_dir: Path, problems: list) -> tuple[dict, dict]:
    """The summary of a finished run (else ``{}``, with the reason in ``problems``) and the job config
    it records (``{}`` if none): a crashed run's summary still names its job."""
    doc, problem = read_summary(run_dir)
    if problem is not None:
        problems.append(f"{problem}; figures come from the traces alone")
    return (doc if problem is None else {}), doc.get("config") or {}


def _read_traces(run_dir: Path, problems: list) -> dict:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            traces = read_run(run_dir)
        except TraceError as err:
            problems.append(str(err))
            traces = {}
    problems.extend(str(w.message) for w in caught)
    if traces:
        world = max(t.world_size for t in traces.values())
        missing = sorted(set(range(world)) - set(traces))
        if missing:
            problems.append(f"{run_dir / 'trace'}: no readable file for rank(s) "
                            f"{', '.join(map(str, missing))} of world size {world}")
    for rank in sorted(traces):
        problems.extend(lost_notes(traces[rank].path, traces[rank].attrs.get("lost_iterations")))
    return traces


def lost_notes(path, lost) -> list[str]:
    """One line per ``[first, last]`` range of iterations a trace at `path` records as lost."""
    return [f"{path}: iterations {first}-{last} have no rows: the run was killed after its checkpoint counted "
            "them and before this rank wrote them (the model has their work)" for first, last in (lost or ())]


def lost_iterations(run_dir: str | os.PathLike) -> list[str]:
    """:func:`lost_notes` of every rank trace of `run_dir`, from their attributes alone (a file that
    does not open is left to the readers that report it)."""
    import json

    import h5py

    notes = []
    for path in sorted((Path(run_dir) / "trace").glob("rank-*.h5")):
        try:
            with h5py.File(path, "r") as f:
                stored = f.attrs.get("lost_iterations_json")  # as TraceWriter.mark_lost writes it
                notes += lost_notes(path, json.loads(stored) if stored is not None else None)
        except (OSError, ValueError):  # a file that does not open, an attribute that is no JSON
            continue
    return notes


def load_run(run_dir: str | os.PathLike) -> RunFrames:
    """Read a run directory (``train --out DIR``) into DataFrames.

    Parameters
    ----------
    run_dir : str or os.PathLike

    Returns
    -------
    RunFrames
        Its ``problems`` list what was missing or damaged; each is also issued as a warning.

    Raises
    ------
    TraceError
        When the directory does not exist, or holds neither a readable trace nor a summary.
    """
    _pandas()  # the extra's error first, before any reading
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise TraceError(f"run directory not found: {run_dir}")
    problems: list[str] = []
    summary, summary_config = _read_summary(run_dir, problems)
    traces = _read_traces(run_dir, problems)
    if not traces and not summary:
        raise TraceError(f"{run_dir}: neither a readable trace nor a finished run's summary.json ("
                         + "; ".join(problems) + ")")

    parts: dict[str, list] = {name: [] for name in TABLES}
    for rank, trace in sorted(traces.items()):
        for name, rows in trace.tables.items():
            if name in parts and len(rows):
                parts[name].append((rank, rows))
    tables = {name: _concat(pieces) if pieces else _empty(name) for name, pieces in parts.items()}
    config = summary_config or next((t.config for t in traces.values() if t.config), {})
    for name in WORKER_TABLES:
        tables[name] = _with_phases(tables[name], servers_of(config))

    for text in problems:
        warnings.warn(text, stacklevel=2)
    return RunFrames(path=run_dir, summary=summary, config=config,
                     attrs={rank: t.attrs for rank, t in traces.items()}, tables=tables, problems=problems)
