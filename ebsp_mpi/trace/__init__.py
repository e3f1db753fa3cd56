"""HDF5 traces of a run: one file per rank, written as the run goes and read back for analysis.

See docs/design.md, "Run outputs". :mod:`.schema` holds the table dtypes, :mod:`.writer` the per-rank
writer, :mod:`.reader` the numpy-level reader.
"""

from .reader import TraceError, TraceFile, read_run, read_trace
from .schema import SCHEMA_VERSION, TABLES
from .writer import NullTrace, TraceWriter, open_trace, trace_path

__all__ = [
    "SCHEMA_VERSION",
    "TABLES",
    "TraceError",
    "TraceFile",
    "TraceWriter",
    "NullTrace",
    "open_trace",
    "read_run",
    "read_trace",
    "trace_path",
]
