"""Backend choice and what the launcher's environment tells a process (no MPI initialised)."""

import io
import os
import sys
from pathlib import Path

import numpy as np
import pytest

from ebsp_mpi.backend import BackendError, cupy_status, resolve_backend
from ebsp_mpi.errors import UsageError
from ebsp_mpi.progress import Progress
from ebsp_mpi.runtime.transport import env as launch
from ebsp_mpi.runtime.transport.env import (BLAS_THREAD_VARS, MPICH, MPICH_SHM_VARS, SHM_EAGER_BYTES, cap_blas_threads,
                                            find_mpiexec, mpi_implementation, prepare_rank_env, rank_from_env,
                                            world_size_from_env)
from ebsp_mpi.runtime.transport.protocol import COALESCE_BYTES


def test_numpy_backend_and_host_copies():
    b = resolve_backend("numpy", env={})
    assert b.name == "numpy" and b.xp is np and b.device is None
    a = np.arange(4, dtype=np.float32)
    assert b.asarray(a) is a  # no copy on the CPU
    assert np.array_equal(b.to_host(a), a)
    assert b.describe() == "numpy (cpu)"


def test_environment_overrides_the_job():
    assert resolve_backend("cupy", env={"EBSP_BACKEND": "numpy"}).name == "numpy"
    with pytest.raises(BackendError, match="EBSP_BACKEND = 'tpu'"):
        resolve_backend("auto", env={"EBSP_BACKEND": "tpu"})


def test_auto_falls_back_to_numpy_and_cupy_explains_itself():
    cupy, reason = cupy_status()
    if cupy is not None:
        pytest.skip("CuPy with a device is present here")
    assert resolve_backend("auto", env={}).name == "numpy"
    with pytest.raises(BackendError, match="backend = 'cupy' but CuPy"):
        resolve_backend("cupy", env={})
    assert reason


@pytest.mark.parametrize("env, size, rank", [
    ({}, 1, 0),
    ({"PMI_SIZE": "5", "PMI_RANK": "3"}, 5, 3),
    ({"OMPI_COMM_WORLD_SIZE": "4", "OMPI_COMM_WORLD_RANK": "2"}, 4, 2),
    ({"SLURM_NTASKS": "8", "SLURM_PROCID": "1"}, 1, 0),  # inside sbatch but not in a job step
    ({"SLURM_NTASKS": "8", "SLURM_PROCID": "1", "SLURM_STEP_ID": "0"}, 8, 1),
])
def test_world_size_and_rank_from_the_launcher(env, size, rank):
    assert world_size_from_env(env) == size
    assert rank_from_env(env) == rank


def test_a_rank_sets_one_thread_and_mpich_eager_messages_only_under_mpi(monkeypatch):
    monkeypatch.setattr(launch, "shm_room", lambda: float("inf"))
    env = {"PMI_SIZE": "5", "OPENBLAS_NUM_THREADS": "4"}
    prepare_rank_env(env)
    assert env["OMP_NUM_THREADS"] == "1" and env["OPENBLAS_NUM_THREADS"] == "4"  # an explicit value wins
    assert all(env[var] == value for var, value in MPICH_SHM_VARS.items())
    # a joined message fits one cell, with room for MPICH's header; anything larger takes the single copy
    cell = int(env["MPIR_CVAR_CH4_SHM_POSIX_IQUEUE_CELL_SIZE"])
    assert COALESCE_BYTES == SHM_EAGER_BYTES < cell <= int(env["MPIR_CVAR_CH4_PACK_BUFFER_SIZE"])
    assert int(env["MPIR_CVAR_CH4_IPC_CMA_P2P_THRESHOLD"]) == SHM_EAGER_BYTES + 1
    # one of them chosen by the user: the rest keep MPICH's defaults (cells too small for the threshold
    # would send every message between the two in pieces)
    mine = {"PMI_SIZE": "5", "MPIR_CVAR_CH4_IPC_CMA_P2P_THRESHOLD": "8192"}
    prepare_rank_env(mine)
    assert [var for var in MPICH_SHM_VARS if var in mine] == ["MPIR_CVAR_CH4_IPC_CMA_P2P_THRESHOLD"]
    alone = {}
    prepare_rank_env(alone)
    assert alone == {}


def test_open_mpi_opens_shared_windows_with_sm_unless_the_user_chose():
    """Open MPI would ask UCX for the window of pushes first, and each rank print an error where UCX
    has no transport for it."""
    env = {"OMPI_COMM_WORLD_SIZE": "3"}
    prepare_rank_env(env)
    assert env["OMPI_MCA_osc"] == "sm"
    mine = {"OMPI_COMM_WORLD_SIZE": "3", "OMPI_MCA_osc": "ucx"}
    prepare_rank_env(mine)
    assert mine["OMPI_MCA_osc"] == "ucx"


@pytest.mark.parametrize("env, ranks", [
    ({"PMI_SIZE": "12", "MPI_LOCALNRANKS": "5"}, 5),  # Hydra: this node's ranks
    ({"OMPI_COMM_WORLD_SIZE": "8", "OMPI_COMM_WORLD_LOCAL_SIZE": "4"}, 4),
    ({"SLURM_STEP_ID": "0", "SLURM_NTASKS": "11", "SLURM_STEP_TASKS_PER_NODE": "3(x2),5"}, 5),
    ({"PMI_SIZE": "9"}, 9),  # nothing says: the whole job, never fewer
])
def test_the_ranks_of_a_node_need_room_for_eager_cells_or_keep_mpichs_defaults(env, ranks):
    need = ranks * launch.SHM_BYTES_PER_RANK
    assert launch.local_ranks(env) == ranks
    got = launch.eager_shm_messages(dict(env), room=need)
    assert {var: got[var] for var in MPICH_SHM_VARS} == MPICH_SHM_VARS
    # a container's 64 MiB /dev/shm, or ulimit -f: MPICH would fail to start with the cells
    assert not any(var in launch.eager_shm_messages(dict(env), room=need - 1) for var in MPICH_SHM_VARS)


def test_the_room_is_half_of_dev_shm_and_no_more_than_ulimit_f(tmp_path, monkeypatch):
    import resource

    stat, unlimited = os.statvfs(tmp_path), (resource.RLIM_INFINITY, resource.RLIM_INFINITY)
    monkeypatch.setattr(resource, "getrlimit", lambda what: unlimited)
    assert launch.shm_room(str(tmp_path)) == stat.f_blocks * stat.f_frsize / 2
    assert launch.shm_room(str(tmp_path / "missing")) == float("inf")  # no /dev/shm to read: no limit of its own
    monkeypatch.setattr(resource, "getrlimit", lambda what: (4 << 20, resource.RLIM_INFINITY))
    assert launch.shm_room(str(tmp_path)) == min(4 << 20, stat.f_blocks * stat.f_frsize / 2)
    assert launch.shm_room(str(tmp_path / "missing")) == 4 << 20


#: rank 0 starts a send of one joined message's size and sees it complete while rank 1 has posted no
#: receive, as only an eager message can; rank 1 then takes it
EAGER_CHILD = """
import sys, time
import numpy as np
from mpi4py import MPI
comm, n = MPI.COMM_WORLD, int(sys.argv[1]) // 4
if comm.rank == 0:
    req = comm.Isend([np.ones(n, np.float32), MPI.FLOAT], 1, 7)
    deadline = time.monotonic() + 2.0
    while not req.Test() and time.monotonic() < deadline:
        time.sleep(1e-3)
    done = req.Test()
    comm.send(done, 1, 8)
    req.Wait()
    print("completed before its receive" if done else "waited for its receive")
else:
    done = comm.recv(source=0, tag=8)
    buf = np.zeros(n, np.float32)
    comm.Recv([buf, MPI.FLOAT], 0, 7)
    assert buf.sum() == n
"""


@pytest.mark.timeout(120)
def test_under_mpich_a_joined_message_travels_eagerly():
    """The settings reach MPICH when a rank starts (``python -m ebsp_mpi`` and the test ranks set them):
    a message of ``COALESCE_BYTES`` completes its send with no receive posted. MPICH's own defaults
    would hold it for the receiver (a rendezvous from 8 KiB), which this test shows too."""
    import subprocess

    from mpirun import child_env, mpiexec

    if mpi_implementation(mpiexec()) != MPICH:
        pytest.skip("the settings are MPICH's")
    if launch.shm_room() < 2 * launch.SHM_BYTES_PER_RANK:
        pytest.skip("no room in /dev/shm for the eager cells of 2 ranks: MPICH's defaults are kept")
    code = f"from ebsp_mpi.runtime.transport.env import prepare_rank_env; prepare_rank_env()\n{EAGER_CHILD}"
    said = {}
    for case, extra in (("ours", {}), ("mpich's", {"MPIR_CVAR_CH4_SHM_POSIX_IQUEUE_CELL_SIZE": "8192"})):
        p = subprocess.run([*mpiexec(), "-n", "2", sys.executable, "-c", code, str(COALESCE_BYTES)],
                           capture_output=True, text=True, timeout=60, env={**child_env(), **extra})
        assert p.returncode == 0, p.stderr
        said[case] = p.stdout.strip()
    assert said == {"ours": "completed before its receive", "mpich's": "waited for its receive"}


def test_blas_threads_capped_in_every_pool_unless_chosen():
    env = cap_blas_threads({"MKL_NUM_THREADS": "3"}, threads=2)
    assert env["MKL_NUM_THREADS"] == "3"
    assert all(env[var] == "2" for var in BLAS_THREAD_VARS if var != "MKL_NUM_THREADS")


def test_mpiexec_is_the_option_then_env_then_beside_python_then_path(tmp_path, monkeypatch):
    assert find_mpiexec("srun --mpi=pmix", env={}) == ["srun", "--mpi=pmix"]
    assert find_mpiexec(None, env={"MPIEXEC": "mpirun -np"}) == ["mpirun", "-np"]
    beside = Path(sys.executable).parent / "mpiexec"
    on_path = tmp_path / "bin"
    on_path.mkdir()
    (on_path / "mpiexec").write_text("#!/bin/sh\n")
    (on_path / "mpiexec").chmod(0o755)
    got = find_mpiexec(None, env={"PATH": str(on_path)})
    assert got == [str(beside)] if beside.is_file() else got == [str(on_path / "mpiexec")]
    monkeypatch.setattr(sys, "executable", str(tmp_path / "python"))
    assert find_mpiexec(None, env={"PATH": str(on_path)}) == [str(on_path / "mpiexec")]
    with pytest.raises(UsageError, match="--mpiexec"):
        find_mpiexec(None, env={"PATH": str(tmp_path / "empty")})


def fake_launcher(tmp_path: Path, name: str, says: str) -> list[str]:
    """A launcher that prints `says` for --version (what each MPI's mpiexec prints first)."""
    path = tmp_path / name
    path.write_text(f"#!/bin/sh\necho '{says}'\n")
    path.chmod(0o755)
    return [str(path)]


@pytest.mark.parametrize("says, kind", [
    ("mpiexec (Open MPI) 5.0.11", launch.OPEN_MPI),
    ("mpirun (Open MPI) 4.1.6", launch.OPEN_MPI),
    ("mpiexec (OpenRTE) 4.1.2", launch.OPEN_MPI),
    ("HYDRA build details:", launch.MPICH),
    ("slurm 23.11.4", None),
])
def test_the_launcher_says_which_mpi_it_starts(says, kind, tmp_path):
    assert launch.mpi_implementation(fake_launcher(tmp_path, "mpiexec", says)) == kind
    assert launch.mpi_implementation([str(tmp_path / "missing")]) is None


def test_open_mpi_gets_oversubscribe_only_beyond_the_cores_and_only_once(tmp_path):
    ompi = fake_launcher(tmp_path, "ompi", "mpiexec (Open MPI) 5.0.11")
    cores = launch.physical_cores()
    assert 1 <= cores <= (os.cpu_count() or 1)
    assert launch.launch_command(ompi, cores) == [*ompi, "-n", str(cores)]
    assert launch.launch_command(ompi, cores + 1) == [*ompi, "--oversubscribe", "-n", str(cores + 1)]
    assert launch.launch_flags([*ompi, "--oversubscribe"], cores + 1) == []
    assert launch.launch_flags(ompi, cores + 1, survivors_speak=True) == ["--oversubscribe"]


def test_mpich_gets_disable_auto_cleanup_only_for_the_survivors_to_speak(tmp_path):
    hydra = fake_launcher(tmp_path, "hydra", "HYDRA build details:")
    assert launch.launch_flags(hydra, 64) == []
    assert launch.launch_flags(hydra, 2, survivors_speak=True) == ["-disable-auto-cleanup"]
    srun = fake_launcher(tmp_path, "srun", "slurm 23.11.4")
    assert launch.launch_command(srun, 64, survivors_speak=True) == [*srun, "-n", "64"]


def test_open_mpi_run_by_root_is_allowed_in_the_launched_environment_only(tmp_path, monkeypatch):
    ompi = fake_launcher(tmp_path, "ompi", "mpiexec (Open MPI) 5.0.11")
    hydra = fake_launcher(tmp_path, "hydra", "HYDRA build details:")
    mine = {"PATH": "/bin"}
    monkeypatch.setattr(os, "geteuid", lambda: 0)
    got = launch.launch_env(ompi, mine)
    assert got == {"PATH": "/bin", "OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1"}
    assert mine == {"PATH": "/bin"}  # a copy: the caller's environment is left alone
    assert launch.launch_env(hydra, mine) == mine
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    assert launch.launch_env(ompi, mine) == mine


def test_progress_writes_plain_lines_off_a_terminal():
    out = io.StringIO()
    p = Progress(10, stream=out, log_every_s=0.0)
    p.update(3, loss=0.5)
    p.close(10, test_acc=0.97)
    lines = out.getvalue().splitlines()
    assert len(lines) == 2 and "\r" not in out.getvalue()
    assert lines[0].startswith("3/10 it") and "loss 0.5" in lines[0]
    assert lines[1].startswith("10/10 it (100%)") and "test_acc 0.97" in lines[1]
    quiet = io.StringIO()
    Progress(10, stream=quiet, enabled=False).close(10)
    assert quiet.getvalue() == ""
