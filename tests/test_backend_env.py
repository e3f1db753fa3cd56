"""Backend choice and what the launcher's environment tells a process (no MPI initialised)."""

import io

import numpy as np
import pytest

from ebsp_mpi.backend import BackendError, cupy_status, resolve_backend
from ebsp_mpi.progress import Progress
from ebsp_mpi.runtime.env import limit_threads_under_mpi, rank_from_env, world_size_from_env


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


def test_threads_default_to_one_per_rank_only_under_mpi():
    env = {"PMI_SIZE": "5", "OPENBLAS_NUM_THREADS": "4"}
    limit_threads_under_mpi(env)
    assert env["OMP_NUM_THREADS"] == "1" and env["OPENBLAS_NUM_THREADS"] == "4"  # an explicit value wins
    alone = {}
    limit_threads_under_mpi(alone)
    assert alone == {}


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
