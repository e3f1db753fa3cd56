"""What the batch scripts in ``slurm/`` ask before they start the ranks with ``srun``.

``python -m ebsp_mpi.slurm mpi`` prints the ``srun --mpi`` plugin for the MPI library that mpi4py
runs on (:func:`srun_mpi`). srun and the library must speak the same process-management interface: the
MPICH wheel from PyPI speaks PMI-1 and PMI-2 but not PMIx (under ``srun --mpi=pmix`` every rank exits
with code 16, "Runtime environment uses unsupported PMI version PMIx"), Open MPI 5 speaks PMIx only,
and under ``--mpi=none`` every task starts an MPI job of its own. ``SRUN_MPI`` in the environment wins.

``python -m ebsp_mpi.slurm finished DIR`` exits 0 when the run in DIR has nothing left to do (its
checkpoint's job stops it where it is, :func:`finished`), 1 when it has training left: a job is
requeued, and resumes, only for a run that goes on, even where the run ended by itself as the signal to
stop came.

``python -m ebsp_mpi.slurm clean-shm`` removes the shared memory that an earlier start of this job
left in ``/dev/shm`` (:func:`clean_shm`). MPICH names each node's segment after the step's PMI job id,
``"<job id>.<step id>"``; a step killed by a signal leaves it behind, and a requeued job (the same job
id, its steps counted from 0 again) opens it, and its ranks wait forever in ``MPI_Init``.

The scripts run these in the batch shell, outside any job step: ``mpi`` loads the MPI library without
starting MPI, and each command imports only what it needs.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from .errors import UsageError
from .safe_text import ascii_digits

#: environment variable that names the plugin and skips the detection
SRUN_MPI_ENV = "SRUN_MPI"
#: MPICH's shared-memory segments: ``mpich_shm_<world id>_<node>`` (and ``mpich_vci_...``), where the world
#: id is the 32-bit FNV-1a hash of the PMI job id, written in hex (``src/mpid/ch4/shm/posix``)
MPICH_SEGMENT_PREFIXES = ("mpich_shm_", "mpich_vci_")
#: the job steps whose segments :func:`clean_shm` looks for: the scripts start one step (0); a few more
#: cover a script that a site extended with steps of its own
STEPS = range(16)


def library_version() -> str:
    """What the MPI library that mpi4py loads says of itself (``MPI_Get_library_version``, which the MPI
    standard allows before ``MPI_Init``: no MPI job is started). Only for a process that uses no MPI
    afterwards: mpi4py's module stays imported without ``MPI_Init``."""
    import mpi4py

    mpi4py.rc.initialize = False
    mpi4py.rc.finalize = False
    from mpi4py import MPI

    return MPI.Get_library_version().rstrip("\x00").strip()


def srun_mpi(version: str) -> str:
    """The ``srun --mpi`` plugin for the MPI library whose version text is `version`.

    - Open MPI (4 and 5): ``pmix``.
    - MPICH and the MPIs built on it (Intel MPI, MVAPICH): ``pmi2``, unless MPICH's configure line shows a
      build for PMIx (``--with-pmix``, ``--with-pmi=pmix``), which then speaks PMIx only: ``pmix``.
    - Anything else: ``pmi2``. Set ``SRUN_MPI`` where a site says otherwise (``srun --mpi=list`` shows the
      plugins it offers; a Cray MPICH takes ``cray_shasta``).
    """
    if "Open MPI" in version:
        return "pmix"
    configure = next((line for line in version.splitlines() if line.strip().startswith("MPICH configure:")), "")
    if "--with-pmix" in configure or "--with-pmi=pmix" in configure:
        return "pmix"
    return "pmi2"


def mpich_world_id(pmi_job_id: str) -> str:
    """MPICH's world id of a job whose PMI job id (KVS name) is `pmi_job_id`, as its segment names
    write it: the 32-bit FNV-1a hash, in lower-case hex without leading zeros. Under srun the PMI job id
    is ``"<job id>.<step id>"``."""
    h = 0x811C9DC5
    for byte in pmi_job_id.encode():
        h = ((h ^ byte) * 0x01000193) & 0xFFFFFFFF
    return f"{h:x}"


def stale_segments(job_id: str, shm_dir: str | os.PathLike = "/dev/shm", steps=STEPS) -> list[Path]:
    """MPICH's shared-memory segments in `shm_dir` that steps `steps` of job `job_id` would use."""
    ids = {mpich_world_id(f"{job_id}.{step}") for step in steps}
    found = []
    try:
        entries = sorted(Path(shm_dir).iterdir())
    except OSError:
        return []
    for path in entries:
        for prefix in MPICH_SEGMENT_PREFIXES:
            if path.name.startswith(prefix):
                world, _, node = path.name[len(prefix):].rpartition("_")
                if world in ids and ascii_digits(node):
                    found.append(path)
    return found


def clean_shm(job_id: str, shm_dir: str | os.PathLike = "/dev/shm", print=print) -> list[Path]:
    """Remove the segments :func:`stale_segments` finds, naming each; returns those removed.

    Call it before the job starts its first step: then no step of this job runs, and any segment of its
    steps is what an earlier start of the same job id left (a requeued job). Segments of other jobs are
    never touched. A segment that cannot be removed (another user's) is named and left.
    """
    removed = []
    for path in stale_segments(job_id, shm_dir):
        try:
            path.unlink()
        except FileNotFoundError:
            continue
        except OSError as e:
            print(f"clean-shm: cannot remove {path}: {e.strerror or e}", file=sys.stderr)
            continue
        removed.append(path)
        print(f"clean-shm: removed {path}, left by an earlier start of job {job_id}")
    return removed


def finished(run_dir) -> str | None:
    """Why the run in `run_dir` has nothing left to do under its checkpoint's job (it has trained its
    ``stop.seconds``, or every worker its last iteration), or None when it goes on.

    Raises
    ------
    UsageError
        When `run_dir` holds no readable checkpoint.
    """
    from .checkpoint import resume_job
    from .cli import work_left

    job, ckpt = resume_job(run_dir, None, [])
    return work_left(job, ckpt)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m ebsp_mpi.slurm",
                                     description="Helpers of the batch scripts in slurm/ (see slurm/README.md).")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    sub.add_parser("mpi", help=f"print the srun --mpi plugin for the MPI library mpi4py runs on (${SRUN_MPI_ENV} "
                               "wins)")
    done = sub.add_parser("finished", help="exit 0 when the run in DIR has nothing left to do (its checkpoint's "
                                           "job stops it), 1 when it goes on")
    done.add_argument("dir", metavar="DIR")
    clean = sub.add_parser("clean-shm", help="remove the shared memory an earlier start of this job left in "
                                             "/dev/shm (MPICH), before the job's first step")
    clean.add_argument("--job", default=os.environ.get("SLURM_JOB_ID", ""),
                       help="job id (default: $SLURM_JOB_ID; none: nothing to do)")
    clean.add_argument("--dir", default="/dev/shm", help="where the segments are (default: /dev/shm)")
    args = parser.parse_args(argv)
    if args.command == "mpi":
        print(os.environ.get(SRUN_MPI_ENV) or srun_mpi(library_version()))
    elif args.command == "finished":
        try:
            why = finished(args.dir)
        except UsageError as e:
            print(f"ebsp_mpi.slurm: error: {e}", file=sys.stderr)
            return 2
        if why is None:
            return 1
        print(f"{args.dir}: finished: {why}")
    elif args.job:
        clean_shm(args.job, args.dir)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
