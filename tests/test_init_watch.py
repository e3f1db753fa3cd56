"""An MPMD launch that gives one rank its own ``MPIR_CVAR_*`` hung silently in ``MPI_Init`` for 300 s,
then dumped a stack (or aborted with MPICH's ``Out of memory``, by chance): the ranks of a node now
compare their settings before ``MPI_Init`` (``runtime.rank.node_settings``), and a rank stuck there all the
same is ended past ``EBSP_MPI_INIT_TIMEOUT_S`` with one line naming its settings (``runtime.rank.init_watch``)."""

import signal
import subprocess
import sys
import time

import pytest

from ebsp_mpi.runtime.rank.init_watch import mpich_settings
from ebsp_mpi.runtime.transport.env import MPICH_SHM_VARS
from mpirun import child_env, mpiexec

WATCHED = ("import time; from ebsp_mpi.runtime.rank.init_watch import InitWatch; w = InitWatch({timeout}, 'stuck'); "
           "time.sleep({sleep}); w.done(); print('returned')")


def test_the_watcher_kills_a_process_past_its_deadline_and_says_why():
    started = time.monotonic()
    p = subprocess.run([sys.executable, "-c", WATCHED.format(timeout=0.5, sleep=30)], capture_output=True, text=True,
                       timeout=60)
    assert p.returncode == -signal.SIGKILL and p.stderr.strip() == "stuck" and time.monotonic() - started < 20


def test_a_process_that_returns_in_time_goes_on_and_leaves_no_watcher():
    p = subprocess.run([sys.executable, "-c", WATCHED.format(timeout=30, sleep=0.1)], capture_output=True, text=True,
                       timeout=60)
    assert p.returncode == 0 and p.stdout.strip() == "returned" and p.stderr == ""


def test_the_settings_say_whose_they_are():
    assert mpich_settings({}) == "none set (MPICH's defaults)"
    assert mpich_settings(dict(MPICH_SHM_VARS)).endswith("(the project's own)")
    assert mpich_settings({"MPIR_CVAR_CH4_IPC_CMA_P2P_THRESHOLD": "1000"}) == \
        "MPIR_CVAR_CH4_IPC_CMA_P2P_THRESHOLD=1000 (not the project's set of four)"


@pytest.mark.timeout(120)
def test_an_mpmd_launch_with_one_ranks_own_mpich_setting_is_named(tmp_path):
    launcher = mpiexec()
    if "mpich" not in " ".join(launcher).lower() and "hydra" not in subprocess.run(
            [*launcher, "--version"], capture_output=True, text=True).stdout.lower():
        pytest.skip("MPICH's MPMD -env syntax")
    train = [sys.executable, "-m", "ebsp_mpi", "train", "-q", "--set", "stop.epochs=0", "--set", "stop.iterations=5",
             "--out", str(tmp_path / "run")]
    cmd = [*launcher, "-n", "1", "-env", "MPIR_CVAR_CH4_IPC_CMA_P2P_THRESHOLD", "1000", *train, ":", "-n", "2", *train]
    for _ in range(3):  # MPICH hung or aborted by chance: each time the same line, before MPI_Init
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=100,
                           env={**child_env(), "EBSP_MPI_INIT_TIMEOUT_S": "30"})
        lines = p.stderr.strip().splitlines()
        assert p.returncode == 2 and len(lines) == 1, p.stderr
        assert lines[0].startswith("ebsp_mpi: error: the ranks of this node differ in their MPICH settings")
        assert "MPIR_CVAR_CH4_IPC_CMA_P2P_THRESHOLD: local rank 0 1000, local rank 1 131073" in lines[0]
        assert not (tmp_path / "run").exists()


@pytest.mark.timeout(120)
def test_a_launch_that_agrees_leaves_no_file_behind(tmp_path):
    import glob

    before = set(glob.glob("/dev/shm/ebsp-mpi-cvars-*"))
    train = [sys.executable, "-m", "ebsp_mpi", "train", "-q", "--set", "stop.epochs=0", "--set", "stop.iterations=5",
             "--out", str(tmp_path / "run")]
    p = subprocess.run([*mpiexec(), "-n", "3", *train], capture_output=True, text=True, timeout=100, env=child_env())
    assert p.returncode == 0, p.stderr
    assert set(glob.glob("/dev/shm/ebsp-mpi-cvars-*")) <= before


@pytest.mark.parametrize("env", [{"MPI_LOCALNRANKS": "3", "MPI_LOCALRANKID": "5", "PMI_SIZE": "3"},
                                 {"MPI_LOCALNRANKS": "99999999", "MPI_LOCALRANKID": "0", "PMI_SIZE": "3"},
                                 {"MPI_LOCALNRANKS": "٣", "MPI_LOCALRANKID": "0", "PMI_SIZE": "3"}])
def test_launcher_values_no_launch_gives_are_not_compared(env):
    """A local rank past the local count was an IndexError; a local count of 10**8 built 10**8 paths."""
    from ebsp_mpi.runtime.rank.node_settings import disagreement

    assert disagreement(env, wait_s=0.1) == (None, [])


@pytest.mark.parametrize("text", ["٥", "inf", "nan", "-1", "1e300", "0.001"])
def test_the_init_deadline_takes_ascii_seconds_within_bounds(text, monkeypatch):
    from ebsp_mpi.cli import _start_mpi
    from ebsp_mpi.errors import UsageError

    monkeypatch.setenv("EBSP_MPI_INIT_TIMEOUT_S", text)
    """'٥' was read as 5 s; 0.001 s ended every run, its line blaming the MPICH settings."""
    with pytest.raises(UsageError, match=r"EBSP_MPI_INIT_TIMEOUT_S = .*: expected seconds from 1 to 604800"):
        _start_mpi()
