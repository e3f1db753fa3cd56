"""What ``train --resume`` refuses, in one line with exit code 2 and before it touches the run: a
checkpoint (or ``model.h5``) that does not match the checksums written with it, an OSDP plan file
replaced since the checkpoint, a launch of the wrong size (named with the run's servers), and a stop
rule that leaves nothing to do (a finished run, or a stop below what was done)."""

import argparse
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import h5py
import numpy as np
import pytest

from ebsp_mpi.checkpoint import CHECKPOINT_FILE, LAST_LOSS, TOTALS, Checkpoint, read_checkpoint, write_checkpoint
from ebsp_mpi.cli import _resumed_job, work_left
from ebsp_mpi import identity
from ebsp_mpi.config import load_job, to_dict
from ebsp_mpi.errors import UsageError
from ebsp_mpi.outputs import read_model, write_model
from mpirun import child_env, resume, train


def checkpoint_of(overrides=(), workers=2, iterations=(7, 6), run_seconds=1.5, params=5) -> Checkpoint:
    job = load_job(None, list(overrides))
    rng = np.random.default_rng(0)
    return Checkpoint(params=rng.standard_normal(params).astype(np.float32),
                      velocity=rng.standard_normal(params).astype(np.float32), version=7,
                      run_seconds=run_seconds, iterations=np.array(iterations[:workers]),
                      totals={**{name: np.full(workers, 0.25) for name in TOTALS}, LAST_LOSS: np.full(workers, 0.5)},
                      policy={"name": "bsp", "done": list(iterations[:workers]), "barriers": 6},
                      evals=[(1.0, 5, 0.3, 0.9)], config=to_dict(job),
                      identity=identity.current(to_dict(job), run_id="run-a").as_dict())


def zero_bytes_of(path: Path, dataset: str, count: int = 20_000, skip: int = 1000) -> None:
    """Overwrite `count` bytes of `dataset`'s stored values with zeros, `skip` bytes in (as a disk or a
    copy gone wrong would): the file still opens, its metadata intact."""
    with h5py.File(path, "r") as f:
        at, size = f[dataset].id.get_offset(), f[dataset].id.get_storage_size()
    assert at is not None and skip + count <= size
    with open(path, "r+b") as f:
        f.seek(at + skip)
        f.write(bytes(count))


def files_of(run_dir: Path) -> dict[str, bytes]:
    return {str(p.relative_to(run_dir)): p.read_bytes() for p in sorted(run_dir.rglob("*")) if p.is_file()}


# -- the files ---------------------------------------------------------------------------------------


def test_a_checkpoint_with_damaged_parameters_is_refused(tmp_path):
    write_checkpoint(tmp_path, checkpoint_of(params=10_000))
    read_checkpoint(tmp_path)  # whole, it reads
    zero_bytes_of(tmp_path / CHECKPOINT_FILE, "params")
    with pytest.raises(UsageError, match="the array 'params' does not match the checksum written with it"):
        read_checkpoint(tmp_path)


def test_a_checkpoint_that_is_a_directory_is_named_as_such(tmp_path):
    (tmp_path / CHECKPOINT_FILE).mkdir()
    with pytest.raises(UsageError, match=re.escape("is not a file (a directory?), so not a checkpoint")):
        read_checkpoint(tmp_path)


def test_a_checkpoint_whose_job_was_changed_is_refused(tmp_path):
    write_checkpoint(tmp_path, checkpoint_of())
    with h5py.File(tmp_path / CHECKPOINT_FILE, "a") as f:
        config = json.loads(f.attrs["config_json"])
        config["optim"]["lr"] = 0.5
        f.attrs["config_json"] = json.dumps(config)
    with pytest.raises(UsageError, match=r"its attributes \(the job, .*\) do not match the checksum"):
        read_checkpoint(tmp_path, arrays=False)


def test_a_damaged_model_file_is_refused_when_read_back(tmp_path):
    rng = np.random.default_rng(1)
    write_model(tmp_path, {"dense1.W": rng.standard_normal((100, 100)).astype(np.float32)}, version=3, step=3)
    tensors, attrs = read_model(tmp_path / "model.h5")
    assert tensors["dense1.W"].shape == (100, 100) and attrs["version"] == 3
    zero_bytes_of(tmp_path / "model.h5", "dense1.W", count=20_000)
    with pytest.raises(UsageError, match=re.escape("tensor dense1.W does not match the checksum")):
        read_model(tmp_path / "model.h5")


# -- the launch and the stop rule ----------------------------------------------------------------------


def test_a_launch_of_the_wrong_size_names_the_world_size_with_the_runs_servers(tmp_path):
    """A run of 2 servers and 2 workers had world size 4, not 3 (the workers plus one)."""
    # no traces here: a run that wrote none (a resumed run checks the traces it would append to)
    write_checkpoint(tmp_path, checkpoint_of(["runtime.servers=2", "trace.enabled=false"], workers=2))
    args = argparse.Namespace(resume=str(tmp_path), out=None, job=None, overrides=[], accept_mismatch=None)
    with pytest.raises(UsageError, match=r"the run had 2 workers, this launch has 3; .*world size 4 under MPI"):
        _resumed_job(args, 5)
    job, workers, plan, _ = _resumed_job(args, 4)
    assert workers == 2 and job.runtime.servers == 2 and plan is None


def test_a_launch_of_the_wrong_size_is_named_before_the_jobs_per_worker_keys(tmp_path):
    """A run with a slowdown per worker: the wrong world size is what the user is told, not that
    straggler.slowdown has the wrong length for the launch's workers."""
    overrides = ["straggler.slowdown=[1,1,1,3]", "trace.enabled=false"]
    write_checkpoint(tmp_path, checkpoint_of(overrides, workers=4, iterations=(7, 6, 7, 6)))
    args = argparse.Namespace(resume=str(tmp_path), out=None, job=None, overrides=[], accept_mismatch=None)
    with pytest.raises(UsageError, match=r"the run had 4 workers, this launch has 2; .*world size 5 under MPI"):
        _resumed_job(args, 3)
    assert _resumed_job(args, 5)[1] == 4


@pytest.mark.parametrize("overrides, iterations, run_seconds, left", [
    (["stop.iterations=10", "stop.epochs=0"], (10, 10), 1.0, "have done [10, 10] iterations"),
    (["stop.iterations=10", "stop.epochs=0"], (10, 9), 1.0, None),  # ASP: one worker still has one to do
    (["stop.iterations=5", "stop.epochs=0"], (10, 10), 1.0, "stop.iterations = 5 stop them at [5, 5]"),
    (["stop.iterations=0", "stop.epochs=0", "stop.seconds=3"], (10, 10), 3.5, "trained 3.5 s and stop.seconds = 3"),
    (["stop.iterations=0", "stop.epochs=0", "stop.seconds=3"], (10, 10), 2.5, None),
    # the digits' 1797 samples, 20 % held out, over 2 workers: 719 and 718 per shard, 22 batches of 32 each
    (["stop.iterations=0", "stop.epochs=1"], (22, 22), 1.0, "stop.epochs = 1 stop them at [22, 22]"),
    (["stop.iterations=0", "stop.epochs=2"], (22, 22), 1.0, None),
])
def test_nothing_left_to_do_is_found_before_the_run_starts(overrides, iterations, run_seconds, left):
    job = load_job(None, overrides)
    why = work_left(job, checkpoint_of(overrides, iterations=iterations, run_seconds=run_seconds))
    assert why is None if left is None else left in why, why


# -- MPI: refused before anything is written -----------------------------------------------------------


@pytest.fixture(scope="module")
def finished(tmp_path_factory) -> Path:
    """A run of 10 BSP iterations that has finished."""
    out = tmp_path_factory.mktemp("finished") / "run"
    p = train(3, out, "stop.iterations=10", timeout=180)
    assert p.returncode == 0, p.stderr
    return out


@pytest.mark.parametrize("overrides, message", [
    ((), "nothing left to do: its workers have done [10, 10] iterations"),
    (("stop.iterations=4",), "stop.iterations = 4, stop.epochs = 30 stop them at [4, 4]"),
], ids=["finished", "stop below what was done"])
def test_resuming_a_run_with_nothing_left_to_do_is_refused_and_changes_nothing(finished, overrides, message):
    before = files_of(finished)
    p = resume(3, finished, *overrides, timeout=120)
    assert p.returncode == 2 and message in p.stderr and p.stderr.count("ebsp_mpi: error") == 1, p.stderr
    assert "Traceback" not in p.stderr
    assert files_of(finished) == before


def test_a_damaged_checkpoint_is_refused_instead_of_trained_on(finished, tmp_path):
    run = tmp_path / "run"
    shutil.copytree(finished, run)
    zero_bytes_of(run / CHECKPOINT_FILE, "params", count=20_000, skip=2000)
    before = files_of(run)
    p = resume(3, run, "stop.iterations=20", timeout=120)
    assert p.returncode == 2 and p.stderr.count("ebsp_mpi: error") == 1, p.stderr
    assert "the array 'params' does not match the checksum" in p.stderr and "Traceback" not in p.stderr
    assert files_of(run) == before


@pytest.mark.parametrize("damage, message", [
    ("truncate server", "the trace {run}/trace/rank-0000.h5 does not open"),
    ("truncate worker", "the trace {run}/trace/rank-0002.h5 does not open"),
    ("delete server", "the trace of server rank 0, {run}/trace/rank-0000.h5, is missing"),
])
def test_a_damaged_or_missing_trace_is_refused_before_the_run_appends_to_it(finished, tmp_path, damage, message):
    """A truncated trace failed its rank's set-up with a traceback; a deleted server trace was begun
    anew, holding the pushes after the checkpoint alone with nothing naming the gap."""
    run = tmp_path / "run"
    shutil.copytree(finished, run)
    how, who = damage.split()
    path = run / "trace" / ("rank-0000.h5" if who == "server" else "rank-0002.h5")
    if how == "truncate":
        with open(path, "r+b") as f:
            f.truncate(path.stat().st_size // 2)
    else:
        path.unlink()
    before = files_of(run)
    p = resume(3, run, "stop.iterations=20", timeout=120)
    assert p.returncode == 2 and p.stderr.count("ebsp_mpi: error") == 1, p.stderr
    assert message.format(run=run) in p.stderr and "Traceback" not in p.stderr, p.stderr
    assert files_of(run) == before


@pytest.mark.timeout(400)
def test_a_plan_file_replaced_since_the_checkpoint_is_refused(tmp_path):
    """A run trained with an OSDP plan resumes with that plan, and is refused once another plan has
    taken its place at the same path (here: every layer resident)."""
    plan = tmp_path / "plan.json"
    made = subprocess.run([sys.executable, "-m", "ebsp_mpi", "plan", "--memory-limit", "100KiB", "--reps", "3",
                           "--warmup", "1", "-q", "--out", str(plan)], capture_output=True, text=True, timeout=120,
                          env=child_env())
    assert made.returncode == 0, made.stderr
    doc = json.loads(plan.read_text())
    assert any(layer["mode"] == "on-demand" for layer in doc["layers"])
    run = tmp_path / "run"
    p = train(3, run, f"osdp.plan={plan}", "stop.iterations=10", timeout=180)
    assert p.returncode == 0, p.stderr
    again = resume(3, run, "stop.iterations=20", timeout=180)  # the same plan: it goes on
    assert again.returncode == 0, again.stderr
    assert json.loads((run / "summary.json").read_text())["iterations"] == [20, 20]

    for layer in doc["layers"]:
        layer.update(mode="resident", slices=1, slice_rows=[], slice_bytes=[])
    plan.write_text(json.dumps(doc))
    before = files_of(run)
    p = resume(3, run, "stop.iterations=30", timeout=120)
    assert p.returncode == 2 and p.stderr.count("ebsp_mpi: error") == 1, p.stderr
    assert f"osdp.plan = '{plan}' has changed since the checkpoint" in p.stderr, p.stderr
    assert files_of(run) == before


@pytest.mark.parametrize("fmt", [1, 2], ids=["unverified", "with checksums"])
def test_a_checkpoint_whose_counts_disagree_is_refused_in_one_line(tmp_path, fmt):
    """Written with iterations that are not the policy's pushes (a faulty writer, or format 1 with no
    checksum at all), a checkpoint resumed into a coordinator's ValueError traceback on rank 0."""
    ckpt = checkpoint_of()
    ckpt.policy["done"] = [7, 5]
    write_checkpoint(tmp_path, ckpt)
    if fmt == 1:
        with h5py.File(tmp_path / CHECKPOINT_FILE, "a") as f:
            f.attrs["format"] = 1
    with pytest.raises(UsageError, match=r"its iterations \[7, 6\] disagree with the sync policy's pushes \[7, 5\]"):
        read_checkpoint(tmp_path)


def test_a_checkpoint_with_a_total_short_of_a_worker_is_refused(tmp_path):
    ckpt = checkpoint_of()
    ckpt.totals["compute_s"] = np.full(1, 0.25)
    write_checkpoint(tmp_path, ckpt)
    with pytest.raises(UsageError, match="its total 'compute_s' has 1 values for 2 workers"):
        read_checkpoint(tmp_path)


def test_a_checkpoint_written_before_checksums_is_read_unverified(tmp_path, caplog):
    """Format 1 carried no checksums: a run checkpointed before them still resumes, with a warning."""
    write_checkpoint(tmp_path, checkpoint_of())
    with h5py.File(tmp_path / CHECKPOINT_FILE, "a") as f:
        f.attrs["format"] = 1
        for key in ("attrs_sha256", "plan_sha256"):
            del f.attrs[key]
        f["params"].attrs["sha256"] = "0" * 64  # not read: format 1 has none
    back = read_checkpoint(tmp_path)
    assert back.version == 7 and back.plan_sha256 == ""
    assert "read unverified" in caplog.text
