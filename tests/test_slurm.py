"""slurm/: the batch scripts parse (bash -n), a sweep's array script renders without Slurm, and the GPU
binding wrapper gives rank 0 no GPU and each worker rank its own."""

import argparse
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

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


def test_train_script_asks_one_gpu_per_worker_and_srun_with_pmix():
    text = (SLURM / "train.sbatch").read_text()
    opts = sbatch_options(text)
    assert int(opts["gpus"]) == int(opts["ntasks"]) - 1  # the server rank takes none
    assert "cpus-per-task" in opts and opts["output"].startswith("logs/")
    assert "srun --mpi=pmix" in text and "slurm/gpu-bind.sh" in text
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
    assert '--member "$TASK"' in text and "srun --mpi=pmix" in text
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


def _fake_slurm(tmp_path: Path) -> dict:
    """A PATH with an `srun` that records its arguments and stops on SIGTERM as the ranks do (writing
    a checkpoint), and an `scontrol` that records what it is asked."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "srun").write_text('#!/bin/bash\necho "$@" > "$LOG/srun.args"\n'
                                  'trap \'touch "$OUT/checkpoint.h5"; echo TERM >> "$LOG/srun.args"; exit 0\' TERM\n'
                                  'for _ in $(seq 100); do sleep 0.1; done\n')
    (bin_dir / "scontrol").write_text('#!/bin/bash\necho "$@" >> "$LOG/scontrol"\n')
    for tool in ("srun", "scontrol"):
        (bin_dir / tool).chmod(0o755)
    (tmp_path / "out").mkdir()
    return {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "LOG": str(tmp_path),
            "OUT": str(tmp_path / "out"), "SLURM_JOB_ID": "42"}


@needs_bash
def test_train_script_checkpoints_and_requeues_near_the_time_limit_then_resumes(tmp_path):
    """USR1 (Slurm's --signal=B:USR1@180) makes the script send SIGTERM to the step (the ranks write a
    checkpoint and stop), then requeue the job; started again, it resumes from the checkpoint."""
    text = (SLURM / "train.sbatch").read_text()
    opts = sbatch_options(text)
    assert opts["signal"].startswith("B:USR1@") and "#SBATCH --requeue" in text
    env = _fake_slurm(tmp_path)
    script = subprocess.Popen([BASH, str(SLURM / "train.sbatch"), "jobs/digits-mlp.toml"], cwd=REPO, env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    args = tmp_path / "srun.args"
    for _ in range(100):
        if args.exists():
            break
        time.sleep(0.05)
    assert "train jobs/digits-mlp.toml --out" in args.read_text()
    script.send_signal(signal.SIGUSR1)
    out, err = script.communicate(timeout=30)
    assert script.returncode == 0, err
    assert "TERM" in args.read_text() and (tmp_path / "scontrol").read_text().split() == ["requeue", "42"]

    again = subprocess.Popen([BASH, str(SLURM / "train.sbatch"), "jobs/digits-mlp.toml"], cwd=REPO, env=env,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    for _ in range(100):
        if "--resume" in args.read_text():
            break
        time.sleep(0.05)
    os.killpg(again.pid, signal.SIGKILL)  # the script and its fake srun
    again.communicate()
    assert f"train --resume {tmp_path / 'out'}" in args.read_text()
