"""A rank's trace file, opened with the attributes every rank writes (docs/design.md, "Run outputs")."""

from __future__ import annotations

import os

from mpi4py import MPI

from ... import __version__
from ...config import to_dict
from ...safe_text import clean_text
from ...trace.writer import open_trace
from ..transport.context import Context


def open_rank_trace(ctx: Context, job, run_dir, *, role: str, backend: str, device: str, append: bool = False):
    """This rank's trace file in `run_dir`, with the root attributes every rank writes (docs/design.md,
    "Run outputs"): run id, rank, role, world size, host, pid, backend, device, MPI library, package
    version, the resolved job and the clock offset to rank 0, and the run's identity
    (``ebsp_mpi.identity``). With `append` (a resumed run), the rank's file is continued."""
    identity = ctx.identity.as_dict() if ctx.identity is not None else {"run_id": run_dir.name}
    attrs = dict(run_id=identity["run_id"], identity=identity, rank=ctx.rank, role=role, world_size=ctx.size,
                 host=ctx.host, pid=os.getpid(),
                 backend=backend, device=device, mpi_library=mpi_library(), package_version=__version__,
                 config=to_dict(job), clock_offset_s=ctx.clock_offset)
    return open_trace(run_dir, ctx.rank, attrs, enabled=job.trace.enabled, flush_seconds=job.trace.flush_seconds,
                      append=append)


def mpi_library() -> str:
    """The MPI library's first version line, e.g. ``MPICH Version: 4.2.0`` or ``Open MPI v5.0.11,
    package: ...`` (whose text ends with the C string's NUL byte, dropped here)."""
    return clean_text(MPI.Get_library_version()).strip().splitlines()[0].strip()
