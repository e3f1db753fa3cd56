"""Shared test set-up.

Under ``mpiexec -n 3 python -m pytest --only-mpi`` every rank is a pytest process: set what a training
run's rank sets for itself before NumPy and MPI start (one BLAS thread, MPICH's eager messages).
"""

import contextlib
import os

import pytest

from ebsp_mpi.runtime.transport.env import SHM_DIR, prepare_rank_env, world_size_from_env

prepare_rank_env()

# The suite starts a few hundred Python processes (each rank of each end-to-end run). Where the
# environment disables bytecode caching, each would compile the package's sources again (about 0.4 s
# of CPU a process); let them cache it in __pycache__ as Python does by default.
os.environ.pop("PYTHONDONTWRITEBYTECODE", None)

#: Test files by their time in the serial pass, the longest first. The README runs the serial pass
#: under pytest-xdist (``-n auto``; setup.cfg: ``--dist loadfile --no-loadscope-reorder``): each
#: worker takes one whole file at a time (so a file's module fixtures, such as a live run several
#: tests read, run once), in collection order; starting with the longest files lets the workers end
#: together instead of one finishing a long file alone. Files not named keep their order after these.
LONGEST_FIRST = ("test_reliability.py", "test_replay_resumed.py", "test_checkpoint.py", "test_servers.py",
                 "test_analysis.py", "test_osdp_runtime.py", "test_simulate_live.py", "test_readme.py",
                 "test_bench.py", "test_emulated_training.py", "test_e2e_mpi.py", "test_simulate.py",
                 "test_hybcomm.py", "test_plan_osdp.py", "test_analysis_examples.py", "test_sweep.py",
                 "test_slurm.py")


def pytest_collection_modifyitems(config, items):
    rank = {name: i for i, name in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))  # a stable sort: order within a file kept


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_auto_num_workers(config):
    """``-n auto``: one worker per CPU this process may use, at most 8. Each worker launches 5-rank
    `mpiexec` runs, so more workers than cores would only make the ranks wait for each other."""
    return max(1, min(len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1, 8))


# -- shared memory left by the runs the suite kills ----------------------------------------------------
#
# A job whose ranks are killed (the fault tests, MPI_Abort) never finalizes MPI, so the shared-memory file
# of its node stays in /dev/shm until it is removed: 11 MB for a 5-rank job with the eager cells every rank
# sets (runtime.transport.env.MPICH_SHM_VARS), RAM that a tmpfs holds. The suite removes those its own runs left: files
# that appeared during the session and that no process maps or holds open. (A job starting beside the
# suite always has its file open or mapped: its first rank creates it open and maps it before closing it.)

SHM_PREFIXES = ("mpich_shm_", "sm_segment.")  # MPICH's; Open MPI's shared-memory transport's
_shm_at_start: set[str] = set()


def _shm_files() -> set[str]:
    try:
        return {name for name in os.listdir(SHM_DIR) if name.startswith(SHM_PREFIXES)}
    except OSError:
        return set()


def _shm_in_use() -> set[str]:
    """The /dev/shm files some other process maps or holds open (as far as this user may read /proc).
    This one's own count as unused: under Open MPI a test that loads MPI in this process maps a file of
    its own until the process exits, and unlinking a file leaves its mappings as they are."""
    used, me = set(), str(os.getpid())
    for pid in filter(lambda p: p.isdigit() and p != me, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/maps") as maps:
                used.update(os.path.basename(line.split()[-1]) for line in maps if SHM_DIR + "/" in line)
            for fd in os.listdir(f"/proc/{pid}/fd"):
                target = os.readlink(f"/proc/{pid}/fd/{fd}")
                if target.startswith(SHM_DIR + "/"):
                    used.add(os.path.basename(target))
        except OSError:
            continue
    return used


def _owns_the_run(config) -> bool:
    """The one process that sees the whole session end: not an xdist worker, not a rank of an MPI pass."""
    return not hasattr(config, "workerinput") and world_size_from_env() == 1


def pytest_sessionstart(session):
    if _owns_the_run(session.config):
        _shm_at_start.update(_shm_files())


def pytest_sessionfinish(session, exitstatus):
    import time

    if not _owns_the_run(session.config) or not os.path.isdir("/proc"):
        return
    # the ranks of a job killed by the last tests may still be dying: give them a few seconds
    for _ in range(10):
        left = _shm_files() - _shm_at_start
        in_use = _shm_in_use() & left
        for name in left - in_use:
            with contextlib.suppress(OSError):
                os.unlink(os.path.join(SHM_DIR, name))
        if not in_use:
            return
        time.sleep(0.5)
