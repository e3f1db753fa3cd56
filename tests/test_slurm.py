"""slurm/: the batch scripts parse (bash -n), a sweep's array script renders without Slurm, the GPU
binding wrapper gives rank 0 no GPU and each worker rank its own, and what train.sbatch does on a time
limit, on a requeue and at start-up, with an srun, scancel and scontrol that act as Slurm's were seen to
(.ci/slurm-check.sh runs the scripts on a real Slurm). Also ebsp_mpi.slurm: the srun PMI plugin for an
MPI library, MPICH's shared-memory names, and a rank's bounded wait in MPI_Init."""

import argparse
import contextlib
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from ebsp_mpi import slurm as sl
from ebsp_mpi import sweep as sw

REPO = Path(__file__).resolve().parent.parent
SLURM = REPO / "slurm"
STRAGGLERS = REPO / "jobs" / "sweeps" / "stragglers.toml"
BASH = shutil.which("bash")

needs_bash = pytest.mark.skipif(BASH is None, reason="no bash")


def bash_n(path: Path) -> subprocess.CompletedProcess:
    return subprocess.run([BASH, "-n", str(path)], capture_output=True, text=True, timeout=30)


def sbatch_options(text: str) -> dict:
    return dict(re.findall(r"^#SBATCH --([\w-]+)=(\S+)", text, flags=re.MULTILINE))


@needs_bash
@pytest.mark.parametrize("name", ["train.sbatch", "sweep.sbatch", "gpu-bind.sh"])
def test_scripts_parse(name):
    p = bash_n(SLURM / name)
    assert p.returncode == 0, p.stderr


def test_train_script_asks_one_gpu_per_worker_and_srun_with_the_plugin_of_the_mpi():
    text = (SLURM / "train.sbatch").read_text()
    opts = sbatch_options(text)
    assert int(opts["gpus"]) == int(opts["ntasks"]) - 1  # the server rank takes none
    assert "cpus-per-task" in opts and opts["output"].startswith("logs/")
    assert 'SRUN_MPI=${SRUN_MPI:-$("$PYTHON" -m ebsp_mpi.slurm mpi)}' in text
    assert 'srun --mpi="$SRUN_MPI"' in text and "slurm/gpu-bind.sh" in text
    assert "OMP_NUM_THREADS=${SLURM_CPUS_PER_TASK" in text and "SRUN_CPUS_PER_TASK" in text


def test_sweep_script_renders_an_array_over_the_members(tmp_path):
    s = sw.load_sweep(STRAGGLERS)
    text = sw.render_sbatch(s, 5, sweep_file="jobs/sweeps/stragglers.toml", out="runs/strag")
    opts = sbatch_options(text)
    assert opts["array"] == "0-14" and opts["ntasks"] == "5" and opts["gpus"] == "4"
    assert opts["job-name"] == "ebsp-stragglers"
    hours, minutes, _ = map(int, opts["time"].split(":"))
    assert 60 * hours + minutes >= s.timeout_s / 60
    assert "SWEEP=${SWEEP:-jobs/sweeps/stragglers.toml}" in text and "OUT=${OUT:-runs/strag}" in text
    assert '--member "$TASK"' in text and 'srun --mpi=$SRUN_MPI' in text
    assert 'SRUN_MPI=${SRUN_MPI:-$("$PYTHON" -m ebsp_mpi.slurm mpi)}' in text
    if BASH:
        rendered = tmp_path / "rendered.sbatch"
        rendered.write_text(text)
        assert bash_n(rendered).returncode == 0


def test_render_follows_the_sweep_and_the_ranks(tmp_path):
    path = tmp_path / "two.toml"
    path.write_text('name = "two"\nseeds = [0, 1, 2]\ntimeout_s = 3000\n'
                    '[[member]]\nname = "a"\n[[member]]\nname = "b"\n')
    text = sw.render_sbatch(sw.load_sweep(path), 9, sweep_file="my sweep.toml")
    opts = sbatch_options(text)
    assert opts["array"] == "0-5" and opts["ntasks"] == "9" and opts["gpus"] == "8"
    assert opts["time"] == "01:00:00"  # 3000 s + 600 s of start-up
    assert "SWEEP=${SWEEP:-'my sweep.toml'}" in text  # quoted for the shell
    assert "OUT=${OUT:-runs/sweep-" in text  # not given: the template's default stays


def test_sbatch_option_writes_the_rendered_script(tmp_path, capsys):
    parser = argparse.ArgumentParser()
    sw.add_parser(parser.add_subparsers())
    target = tmp_path / "job.sbatch"
    args = parser.parse_args(["sweep", str(STRAGGLERS), "-n", "5", "--sbatch", str(target)])
    assert args.run(args) == 0
    assert sbatch_options(target.read_text())["array"] == "0-14"
    assert "15 members" in capsys.readouterr().out


def test_a_template_without_the_array_line_is_refused(tmp_path):
    template = tmp_path / "t.sbatch"
    template.write_text("#!/bin/bash\n#SBATCH --ntasks=5\n")
    with pytest.raises(sw.SweepError, match="--job-name"):
        sw.render_sbatch(sw.load_sweep(STRAGGLERS), 5, template=template)


@needs_bash
@pytest.mark.parametrize("procid, localid, nodeid, visible, servers, expected", [
    ("0", "0", "0", "0,1,2,3", "1", ""),   # the server: no GPU
    ("1", "1", "0", "0,1,2,3", "1", "0"),  # workers on the server's node: local ids 1..4 -> GPUs 0..3
    ("4", "4", "0", "0,1,2,3", "1", "3"),
    ("5", "0", "1", "4,5,6,7", "1", "4"),  # a second node: local id 0 -> its first GPU
    ("2", "0", "0", "7", "1", "7"),        # --gpus-per-task=1: the task's own GPU
    ("1", "1", "0", "0,1,2,3", "2", ""),   # runtime.servers = 2: rank 1 is a server too
    ("2", "2", "0", "0,1,2,3", "2", "0"),  # ... and the workers start at rank 2
    ("5", "5", "0", "0,1,2,3", "2", "3"),
])
def test_gpu_binding(procid, localid, nodeid, visible, servers, expected):
    env = dict(os.environ, SLURM_PROCID=procid, SLURM_LOCALID=localid, SLURM_NODEID=nodeid,
               CUDA_VISIBLE_DEVICES=visible, EBSP_SERVERS=servers)
    p = subprocess.run([str(SLURM / "gpu-bind.sh"), sys.executable, "-c",
                        "import os; print(repr(os.environ['CUDA_VISIBLE_DEVICES']))"],
                       capture_output=True, text=True, env=env, timeout=30)
    assert p.returncode == 0, p.stderr
    assert p.stdout.strip() == repr(expected)


def _fake_slurm(tmp_path: Path, **env) -> dict:
    """A PATH with the parts of Slurm that train.sbatch calls, acting as a real Slurm 22.05 did:

    - ``srun`` records its arguments and starts one task, which on SIGTERM writes the checkpoint (a copy
      of ``$CHECKPOINT_FROM``, else an empty file) and exits 0. srun itself, sent SIGTERM, kills its task
      at once (SIGKILL), as a real srun does ("forcing job termination"): no checkpoint then.
    - ``scancel --signal=TERM JOB`` sends SIGTERM to the job's tasks (not to srun, nor to the batch script).
    - ``scontrol`` records what it is asked.

    The script's Python is this one (``$PYTHON``), with no virtual environment to activate.
    """
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "srun").write_text(
        '#!/bin/bash\n'
        'echo "$@" >> "$LOG/srun.args"\n'
        'bash -c \'trap "if [[ -n \\"$CHECKPOINT_FROM\\" ]]; then cp \\"$CHECKPOINT_FROM\\" \\"$OUT/checkpoint.h5\\"; '
        'else touch \\"$OUT/checkpoint.h5\\"; fi; echo task-TERM >> \\"$LOG/srun.args\\"; exit 0" TERM; '
        'for _ in $(seq 200); do sleep 0.1; done\' &\n'
        'task=$!\n'
        'echo $task > "$LOG/task.pid"\n'
        'trap \'echo srun-TERM >> "$LOG/srun.args"; kill -KILL $task; exit 143\' TERM\n'
        'wait $task\n')
    (bin_dir / "scancel").write_text(
        '#!/bin/bash\n'
        'echo "$@" >> "$LOG/scancel"\n'
        'if [[ "$1" == --signal=TERM && "$2" == "$SLURM_JOB_ID" ]]; then kill -TERM "$(cat "$LOG/task.pid")"; fi\n')
    (bin_dir / "scontrol").write_text('#!/bin/bash\necho "$@" >> "$LOG/scontrol"\n')
    for tool in ("srun", "scancel", "scontrol"):
        (bin_dir / tool).chmod(0o755)
    (tmp_path / "out").mkdir(exist_ok=True)
    return {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "LOG": str(tmp_path),
            "OUT": str(tmp_path / "out"), "SLURM_JOB_ID": "42", "PYTHON": sys.executable,
            "VENV": str(tmp_path / "no-venv"), "CHECKPOINT_FROM": "", **env}


def _start(env: dict, *args: str) -> subprocess.Popen:
    return subprocess.Popen([BASH, str(SLURM / "train.sbatch"), *args], cwd=REPO, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)


def _wait_for(path: Path, text: str, script: subprocess.Popen, timeout: float = 60) -> str:
    """The contents of `path` once they hold `text` (while `script` runs)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if path.exists() and text in path.read_text():
            return path.read_text()
        if script.poll() is not None:
            break
        time.sleep(0.05)
    out, err = script.communicate(timeout=30) if script.poll() is None else ("", "")
    raise AssertionError(f"{path} never held {text!r}: {path.read_text() if path.exists() else 'absent'}; "
                         f"script exit {script.returncode}; {out} {err}")


def _stop(script: subprocess.Popen) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(script.pid, signal.SIGKILL)  # the script and its fake srun
    script.communicate(timeout=30)


@pytest.fixture(scope="module")
def finished_checkpoint(tmp_path_factory) -> Path:
    """The checkpoint of a finished run: the embedded job, 3 iterations, in one process."""
    out = tmp_path_factory.mktemp("finished") / "run"
    p = subprocess.run([sys.executable, "-m", "ebsp_mpi", "train", "--set", "stop.iterations=3", "--out", str(out),
                        "-q"], cwd=REPO, capture_output=True, text=True, timeout=240)
    assert p.returncode == 0, p.stderr
    return out / "checkpoint.h5"


@needs_bash
def test_train_script_checkpoints_and_requeues_near_the_time_limit_then_resumes(tmp_path):
    """USR1 (Slurm's --signal=B:USR1@180) makes the script have Slurm send SIGTERM to the ranks (scancel
    --signal=TERM), which write a checkpoint and stop; then it requeues the job. Started again, it
    resumes from the checkpoint. A SIGTERM to srun instead would kill the ranks before any checkpoint."""
    text = (SLURM / "train.sbatch").read_text()
    opts = sbatch_options(text)
    assert opts["signal"].startswith("B:USR1@") and "#SBATCH --requeue" in text
    env = _fake_slurm(tmp_path)
    script = _start(env, "jobs/digits-mlp.toml")
    args = _wait_for(tmp_path / "srun.args", "train", script)
    plugin = subprocess.run([sys.executable, "-m", "ebsp_mpi.slurm", "mpi"], cwd=REPO, capture_output=True,
                            text=True, timeout=60).stdout.strip()
    assert args.startswith(f"--mpi={plugin} --cpu-bind=cores slurm/gpu-bind.sh {sys.executable} -m ebsp_mpi train")
    # periodic checkpoints by default, before the arguments so that a --set there wins
    assert f"train --set checkpoint.every_seconds=600 jobs/digits-mlp.toml --out {tmp_path / 'out'}" in args
    _wait_for(tmp_path / "task.pid", "", script)
    script.send_signal(signal.SIGUSR1)
    _, err = script.communicate(timeout=60)
    assert script.returncode == 0, err
    assert (tmp_path / "scancel").read_text().split() == ["--signal=TERM", "42"]
    assert "task-TERM" in (tmp_path / "srun.args").read_text()  # the task had SIGTERM itself ...
    assert "srun-TERM" not in (tmp_path / "srun.args").read_text()  # ... and srun none
    assert (tmp_path / "out" / "checkpoint.h5").exists()
    assert (tmp_path / "scontrol").read_text().split() == ["requeue", "42"]

    again = _start(env, "jobs/digits-mlp.toml")
    _wait_for(tmp_path / "srun.args", "--resume", again)
    _stop(again)
    assert f"train --resume {tmp_path / 'out'}\n" in (tmp_path / "srun.args").read_text()


@needs_bash
def test_a_run_that_ended_as_usr1_came_is_not_requeued_nor_started_again(tmp_path, finished_checkpoint):
    """The ranks' SIGTERM came after the run had ended by itself (its checkpoint is its last): no
    requeue; and a job started on a finished run's directory ends at once (a resume would be refused)."""
    env = _fake_slurm(tmp_path, CHECKPOINT_FROM=str(finished_checkpoint))
    script = _start(env)
    _wait_for(tmp_path / "task.pid", "", script)
    script.send_signal(signal.SIGUSR1)
    out, err = script.communicate(timeout=120)
    assert script.returncode == 0, err
    assert "task-TERM" in (tmp_path / "srun.args").read_text()
    assert not (tmp_path / "scontrol").exists()  # not requeued
    assert "finished: its workers have done [3] iterations" in out

    (tmp_path / "srun.args").unlink()
    again = subprocess.run([BASH, str(SLURM / "train.sbatch")], cwd=REPO, env=env, capture_output=True,
                           text=True, timeout=120)
    assert again.returncode == 0, again.stderr
    assert "finished:" in again.stdout and not (tmp_path / "srun.args").exists()


@needs_bash
def test_a_requeued_job_whose_first_start_left_no_checkpoint_starts_over_keeping_what_it_wrote(tmp_path):
    env = _fake_slurm(tmp_path, SLURM_RESTART_COUNT="1", CHECKPOINT_SECONDS="")
    (tmp_path / "out" / "trace").mkdir()
    (tmp_path / "out" / "trace" / "rank-0000.h5").write_text("the first start's")
    script = _start(env, "jobs/digits-mlp.toml")
    args = _wait_for(tmp_path / "srun.args", "train", script)
    _stop(script)
    assert f"train jobs/digits-mlp.toml --out {tmp_path / 'out'}\n" in args  # CHECKPOINT_SECONDS empty: the job's
    kept = tmp_path / "out.before-restart-1" / "trace" / "rank-0000.h5"
    assert kept.read_text() == "the first start's" and not (tmp_path / "out" / "trace").exists()


@needs_bash
@pytest.mark.skipif(not Path("/dev/shm").is_dir(), reason="no /dev/shm")
def test_train_script_removes_what_a_killed_step_of_its_job_left_in_dev_shm(tmp_path):
    """A requeued job keeps its id, and its step 0 its PMI job id "<job>.0": MPICH's segment of the
    killed step would make its ranks wait in MPI_Init for ever. The script removes it before srun."""
    stale = Path("/dev/shm") / f"mpich_shm_{sl.mpich_world_id('42.0')}_0"
    stale.write_bytes(b"left by a killed step")
    try:
        env = _fake_slurm(tmp_path)
        script = _start(env)
        _wait_for(tmp_path / "srun.args", "train", script)
        _stop(script)
        assert not stale.exists()
    finally:
        stale.unlink(missing_ok=True)


@pytest.mark.parametrize("version, plugin", [
    (("MPICH Version:      5.0.2\nMPICH Release date: Fri Sep 25 20:45:26 UTC 2026\nMPICH ABI:          18:2:6\n"
      "MPICH Device:       ch4:ucx ofi\nMPICH configure:    --with-device=ch4:ucx,ofi --with-pm=hydra:gforker\n"),
     "pmi2"),  # the mpich wheel from PyPI: no PMIx
    ("Open MPI v5.0.11, package: Open MPI user@localhost Distribution, ident: 5.0.11, repo rev: v5.0.11rc1", "pmix"),
    ("Open MPI v4.1.6, package: Debian OpenMPI, ident: 4.1.6, repo rev: v4.1.6, Sep 30, 2023", "pmix"),
    ("MPICH Version:      4.2.0\nMPICH configure:    --prefix=/opt/mpich --with-pmix=/usr --with-pm=no\n", "pmix"),
    ("MPICH Version:      4.1.2\nMPICH configure:    --with-pmi=pmix --with-device=ch4:ofi\n", "pmix"),
    ("Intel(R) MPI Library 2021.10 for Linux* OS", "pmi2"),
])
def test_srun_plugin_follows_the_mpi_library(version, plugin):
    assert sl.srun_mpi(version) == plugin


def _library_version() -> str:
    code = "import mpi4py; mpi4py.rc.initialize = False\nfrom mpi4py import MPI; print(MPI.Get_library_version())"
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60).stdout


def test_slurm_mpi_command_names_the_plugin_of_this_environment_and_srun_mpi_wins():
    def plugin(**env):
        return subprocess.run([sys.executable, "-m", "ebsp_mpi.slurm", "mpi"], cwd=REPO, capture_output=True,
                              text=True, timeout=60, env={**os.environ, "SRUN_MPI": "", **env}).stdout.strip()

    assert plugin() == sl.srun_mpi(_library_version())
    assert plugin(SRUN_MPI="cray_shasta") == "cray_shasta"


def test_mpich_segment_names_are_those_seen_under_srun():
    # /dev/shm/mpich_shm_a620f805_0 and _fb904474_0 were the segments of steps 4.0 and 12.0 (Slurm 22.05,
    # srun --mpi=pmi2, the mpich 5.0.2 wheel)
    assert sl.mpich_world_id("4.0") == "a620f805"
    assert sl.mpich_world_id("12.0") == "fb904474"


def test_clean_shm_removes_the_segments_of_this_job_only(tmp_path):
    mine = [f"mpich_shm_{sl.mpich_world_id('77.0')}_0", f"mpich_vci_{sl.mpich_world_id('77.0')}_0",
            f"mpich_shm_{sl.mpich_world_id('77.3')}_1"]
    others = [f"mpich_shm_{sl.mpich_world_id('78.0')}_0", f"mpich_shm_{sl.mpich_world_id('177.0')}_0",
              f"sm_segment.host.0.{sl.mpich_world_id('77.0')}.0", "mpich_shm_zz_0"]
    for name in mine + others:
        (tmp_path / name).write_text("x")
    said = []
    removed = sl.clean_shm("77", tmp_path, print=lambda *a, **k: said.append(a[0]))
    assert sorted(p.name for p in removed) == sorted(mine)
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(others)
    assert len(said) == 3 and all("left by an earlier start of job 77" in line for line in said)
    assert sl.clean_shm("77", tmp_path / "absent") == []


def test_finished_tells_a_finished_run_from_one_with_training_left(tmp_path, finished_checkpoint):
    import dataclasses

    import numpy as np

    from ebsp_mpi.checkpoint import read_checkpoint, write_checkpoint

    def finished(run):
        return subprocess.run([sys.executable, "-m", "ebsp_mpi.slurm", "finished", str(run)], cwd=REPO,
                              capture_output=True, text=True, timeout=120)

    done = finished(finished_checkpoint.parent)
    assert done.returncode == 0 and "finished: its workers have done [3] iterations" in done.stdout
    ckpt = read_checkpoint(finished_checkpoint.parent)
    (tmp_path / "part").mkdir()
    write_checkpoint(tmp_path / "part", dataclasses.replace(ckpt, iterations=np.array([1])))
    part = finished(tmp_path / "part")
    assert part.returncode == 1 and part.stdout == ""
    none = finished(tmp_path)
    assert none.returncode == 2 and "no checkpoint.h5" in none.stderr


needs_mpich = pytest.mark.skipif("MPICH" not in _library_version(), reason="the simple PMI of MPICH's wheel")


@needs_mpich
def test_a_rank_that_mpi_init_holds_exits_after_ebsp_mpi_init_timeout(tmp_path):
    """A process manager that never answers (as a stale segment of a requeued job holds MPICH's ranks)
    holds MPI_Init for ever; past EBSP_MPI_INIT_TIMEOUT_S the rank's watcher says so in one line, naming
    the rank's MPICH settings, and kills it (runtime.rank.init_watch)."""
    import socket

    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(4)
        env = {**os.environ, "PMI_PORT": f"127.0.0.1:{silent.getsockname()[1]}", "PMI_RANK": "0",
               "PMI_SIZE": "2", "PMI_ID": "0", "EBSP_MPI_INIT_TIMEOUT_S": "3"}
        p = subprocess.run([sys.executable, "-m", "ebsp_mpi", "train", "--out", str(tmp_path / "run")], cwd=REPO,
                           env=env, capture_output=True, text=True, timeout=120)
    assert p.returncode == -signal.SIGKILL
    assert p.stderr.startswith("ebsp_mpi: error: rank 0: MPI_Init has not returned after 3 s (EBSP_MPI_INIT_TIMEOUT_S)")
    assert p.stderr.count("\n") == 1, p.stderr
    assert not (tmp_path / "run").exists()

    for value in ("soon", "-1", "1e300"):  # 1e300 passed, and faulthandler's timer raised OverflowError
        bad = subprocess.run([sys.executable, "-m", "ebsp_mpi", "train"], cwd=REPO, capture_output=True, text=True,
                             env={**env, "EBSP_MPI_INIT_TIMEOUT_S": value}, timeout=120)
        assert bad.returncode == 2
        assert bad.stderr == (f"ebsp_mpi: error: EBSP_MPI_INIT_TIMEOUT_S = {value!r}: expected seconds from 1 "
                              "to 604800 (a week), or 0 (no limit)\n"), bad.stderr


@needs_mpich
def test_tasks_that_mpi_does_not_join_into_one_world_are_refused_in_one_line(tmp_path):
    """srun --mpi=none: every task an MPI job of one rank, each its rank 0 (here one such task)."""
    env = {**os.environ, "SLURM_NTASKS": "2", "SLURM_STEP_ID": "0", "SLURM_PROCID": "0"}
    for var in ("PMI_SIZE", "PMI_RANK", "OMPI_COMM_WORLD_SIZE", "PMIX_SIZE", "MPI_LOCALNRANKS"):
        env.pop(var, None)
    p = subprocess.run([sys.executable, "-m", "ebsp_mpi", "train", "--out", str(tmp_path / "run")], cwd=REPO,
                       env=env, capture_output=True, text=True, timeout=120)
    assert p.returncode == 2
    assert p.stderr.startswith("ebsp_mpi: error: the launcher started 2 processes, but MPI sees a world of 1")
    assert not (tmp_path / "run").exists()
