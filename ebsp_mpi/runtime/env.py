"""What the launcher tells a process through the environment, read without initialising MPI.

The CLI decides between the single-process trainer and the MPI runtime before importing mpi4py, so a
plain ``python -m ebsp_mpi train`` never needs a working MPI library.
"""

from __future__ import annotations

import os

# MPICH/Hydra and Intel MPI, Open MPI, PMIx (Open MPI 5, Slurm --mpi=pmix), Slurm's srun
_SIZE_VARS = ("PMI_SIZE", "OMPI_COMM_WORLD_SIZE", "PMIX_SIZE", "MPI_LOCALNRANKS", "SLURM_NTASKS")
_RANK_VARS = ("PMI_RANK", "OMPI_COMM_WORLD_RANK", "PMIX_RANK", "SLURM_PROCID")
_THREAD_VARS = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "BLIS_NUM_THREADS",
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
        for var in _THREAD_VARS:
            env.setdefault(var, "1")
