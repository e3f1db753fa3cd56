"""A run records what it was made from (its run id, the job, the dataset files, the code:
``ebsp_mpi.identity``), and ``train --resume`` and ``simulate --replay`` check each piece before they
use it: a differing piece is one line naming it and both values, exit code 2, every file as it was;
``--accept-mismatch PIECE`` goes on, the summary records it, and a replay so made is never exact."""

import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from cliutil import one_line_error
from datafiles import write_h5
from ebsp_mpi import identity
from ebsp_mpi.checkpoint import read_checkpoint, write_checkpoint
from ebsp_mpi.cli import main
from ebsp_mpi.data.fingerprint import BLOCK_BYTES, BLOCKS, file_fingerprint
from mpirun import child_env, resume, train

QUICK = ["stop.epochs=0", "stop.iterations=20", "eval.every_seconds=100"]


def files_of(run_dir: Path) -> dict[str, bytes]:
    return {str(p.relative_to(run_dir)): p.read_bytes() for p in sorted(run_dir.rglob("*")) if p.is_file()}


def sets(*overrides):
    return [arg for o in overrides for arg in ("--set", o)]


def data_file(path: Path, seed: int = 0) -> Path:
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(300, 8)).astype(np.float32)
    return Path(write_h5(path, x=x, y=(x[:, 0] > 0).astype(np.int64)))


@pytest.fixture
def single_run(tmp_path):
    """A finished single-process run on an HDF5 file, ready to be resumed for 20 more iterations."""
    data = data_file(tmp_path / "d.h5")
    run = tmp_path / "run"
    assert main(["train", "-q", "--out", str(run), *sets(*QUICK, "data.name=hdf5", f"data.path={data}")]) == 0
    return run, data


def resume_args(run, *extra):
    return ["train", "-q", "--resume", str(run), "--set", "stop.iterations=40", *extra]


# -- the fingerprints ---------------------------------------------------------------------------------


def test_a_replaced_file_of_the_same_size_changes_its_fingerprint(tmp_path):
    path = tmp_path / "big.bin"
    rng = np.random.default_rng(0)
    body = rng.integers(0, 256, size=BLOCKS * BLOCK_BYTES * 4, dtype=np.uint8).tobytes()
    path.write_bytes(body)
    before = file_fingerprint(str(path))
    path.write_bytes(body[:-1] + bytes([body[-1] ^ 1]))  # the last byte: the file's last block is sampled
    assert file_fingerprint(str(path)) != before and before.startswith(f"{len(body)}:")
    path.write_bytes(rng.integers(0, 256, size=len(body), dtype=np.uint8).tobytes())  # another file, same size
    assert file_fingerprint(str(path)) not in (before,)
    assert file_fingerprint(str(tmp_path / "none")) == "missing"


def test_the_embedded_dataset_has_an_identity_too():
    from ebsp_mpi.config import load_job, to_dict

    data = identity.current(to_dict(load_job(None, []))).data
    assert list(data) == ["digits.csv.gz"] and data["digits.csv.gz"].count(":") == 1


def test_accept_mismatch_takes_only_known_pieces(capsys):
    assert identity.parse_accepted("all") == set(identity.PIECES)
    assert "'bogus' is not a piece" in one_line_error(capsys, ["train", "--resume", "x", "--accept-mismatch",
                                                                "job,bogus"])
    assert "goes with --resume" in one_line_error(capsys, ["train", "--accept-mismatch", "job"])


@pytest.mark.timeout(60)
@pytest.mark.parametrize("special", ["fifo", "/dev/zero"])
def test_a_dataset_path_that_is_not_a_regular_file_is_refused_not_read(special, tmp_path, capsys):
    """The fingerprint read a FIFO (the open blocked for ever) and /dev/zero (without end)."""
    import os

    path = tmp_path / "fifo.h5" if special == "fifo" else Path(special)
    if special == "fifo":
        os.mkfifo(path)
    line = one_line_error(capsys, ["train", "-q", "--out", str(tmp_path / "run"),
                                   *sets(*QUICK, "data.name=hdf5", f"data.path={path}")])
    assert f"missing dataset file '{path}'" in line and not (tmp_path / "run").exists()


# -- train --resume -----------------------------------------------------------------------------------


def test_a_run_records_its_identity_in_its_checkpoint_and_summary(single_run):
    run, _ = single_run
    summary = json.loads((run / "summary.json").read_text())
    ckpt = read_checkpoint(run, arrays=False)
    assert summary["run_id"] == ckpt.identity["run_id"] and len(summary["run_id"]) == 16
    assert summary["identity"]["code"] == identity.code_version() and summary["accepted_mismatch"] is None
    assert list(summary["identity"]["data"]) == ["d.h5"]


def test_a_resume_with_the_same_pieces_goes_on(single_run):
    run, _ = single_run
    run_id = json.loads((run / "summary.json").read_text())["run_id"]
    assert main(resume_args(run)) == 0
    summary = json.loads((run / "summary.json").read_text())
    assert summary["run_id"] == run_id and summary["iterations"] == [40]


def test_a_replaced_dataset_file_is_refused_then_accepted(single_run, capsys):
    run, data = single_run
    data_file(data, seed=1)  # the same shapes and size, other samples
    before = files_of(run)
    line = one_line_error(capsys, resume_args(run))
    assert "the dataset differs from the run's: it was d.h5 " in line and "--accept-mismatch data" in line
    assert files_of(run) == before
    assert main(resume_args(run, "--accept-mismatch", "data")) == 0
    accepted = json.loads((run / "summary.json").read_text())["accepted_mismatch"]
    assert set(accepted) == {"data"} and accepted["data"]["recorded"] != accepted["data"]["now"]


def test_another_code_version_is_refused_then_accepted(single_run, capsys):
    run, _ = single_run
    ckpt = read_checkpoint(run)
    ckpt.identity["code"] = "0.0.9+000000000000"
    write_checkpoint(run, ckpt)
    before = files_of(run)
    line = one_line_error(capsys, resume_args(run))
    assert f"the code version differs from the run's: it was 0.0.9+000000000000, it is {identity.code_version()} now" \
        in line
    assert files_of(run) == before
    assert main(resume_args(run, "--accept-mismatch", "code")) == 0
    summary = json.loads((run / "summary.json").read_text())
    assert summary["accepted_mismatch"]["code"]["recorded"] == "0.0.9+000000000000"


def test_a_summary_of_another_run_is_refused(single_run, capsys):
    run, _ = single_run
    summary = json.loads((run / "summary.json").read_text())
    own = summary["run_id"]
    summary["run_id"] = "another-run"
    (run / "summary.json").write_text(json.dumps(summary))
    line = one_line_error(capsys, resume_args(run))
    assert f"the run id differs from the run's ({run / 'summary.json'}): it was {own}, it is another-run now" in line
    assert main(resume_args(run, "--accept-mismatch", "run")) == 0
    assert json.loads((run / "summary.json").read_text())["run_id"] == own


def test_a_changed_job_is_refused_then_accepted_but_never_one_that_shapes_the_checkpoint(single_run, capsys):
    run, _ = single_run
    before = files_of(run)
    line = one_line_error(capsys, resume_args(run, "--set", "optim.lr=0.1"))
    assert "the job differs from the run's in optim.lr (optim.lr = 0.05 then, 0.1 now)" in line
    line = one_line_error(capsys, resume_args(run, "--set", "model.hidden=[7]", "--accept-mismatch", "job"))
    assert "model.hidden" in line and "even with --accept-mismatch job" in line
    assert files_of(run) == before
    assert main(resume_args(run, "--set", "optim.lr=0.1", "--accept-mismatch", "job")) == 0
    summary = json.loads((run / "summary.json").read_text())
    assert set(summary["accepted_mismatch"]) == {"job"} and summary["config"]["optim"]["lr"] == 0.1


def test_a_checkpoint_without_an_identity_needs_the_flag(single_run, capsys):
    """A run recorded before identities: each piece it lacks is named, and --accept-mismatch all goes on."""
    run, _ = single_run
    ckpt = read_checkpoint(run)
    ckpt.identity = None
    write_checkpoint(run, ckpt)
    line = one_line_error(capsys, resume_args(run))
    assert "the run id differs from the run's" in line and "it was not recorded" in line
    assert main(resume_args(run, "--accept-mismatch", "all")) == 0
    summary = json.loads((run / "summary.json").read_text())
    assert set(summary["accepted_mismatch"]) == {"run", "data", "code"}


# -- MPI: the traces carry the run id; a replay checks what it claims ------------------------------------


@pytest.fixture(scope="module")
def live_run(tmp_path_factory):
    """A finished 3-rank ASP run on an HDF5 file."""
    base = tmp_path_factory.mktemp("live")
    data = data_file(base / "d.h5")
    p = train(3, base / "run", *QUICK, "sync.model=asp", "data.name=hdf5", f"data.path={data}",
              "data.batch_size=10", timeout=180)
    assert p.returncode == 0, p.stderr
    return base / "run", data


def copy_of(live_run, tmp_path):
    run, data = live_run
    shutil.copytree(run, tmp_path / "run")
    shutil.copy(data, tmp_path / "d.h5")
    return tmp_path / "run"


def simulate(*args, code=0):
    p = subprocess.run([sys.executable, "-m", "ebsp_mpi", "simulate", "-q", *map(str, args)], capture_output=True,
                       text=True, timeout=180, env=child_env())
    assert p.returncode == code, p.stdout + p.stderr
    if code == 2:
        lines = p.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("ebsp_mpi: error:"), p.stderr
        return lines[0]
    return json.loads(Path(args[args.index("--out") + 1], "summary.json").read_text())


def test_every_trace_carries_the_runs_id(live_run):
    import h5py

    run, _ = live_run
    run_id = json.loads((run / "summary.json").read_text())["run_id"]
    for path in sorted((run / "trace").glob("rank-*.h5")):
        with h5py.File(path, "r") as f:
            assert f.attrs["run_id"] == run_id, path


def test_a_trace_of_another_run_is_refused_by_resume_and_replay(live_run, tmp_path, tmp_path_factory):
    run = copy_of(live_run, tmp_path)
    other = tmp_path_factory.mktemp("other") / "run"
    assert train(3, other, *QUICK, timeout=180).returncode == 0
    shutil.copy(other / "trace" / "rank-0002.h5", run / "trace" / "rank-0002.h5")
    before = files_of(run)
    p = resume(3, run, "stop.iterations=30", timeout=180)
    lines = p.stderr.strip().splitlines()
    assert p.returncode == 2 and len(lines) == 1, p.stderr
    assert f"the run id differs from the run's ({run / 'trace' / 'rank-0002.h5'})" in lines[0]
    line = simulate("--replay", run, "--out", tmp_path / "replay", code=2)
    assert "the run id differs from the run's" in line and "rank-0002.h5" in line
    assert files_of(run) == before and not (tmp_path / "replay").exists()
    # a replay cannot read a file of another run (the reader leaves it out): no flag makes it go on
    line = simulate("--replay", run, "--out", tmp_path / "replay", "--accept-mismatch", "run", code=2)
    assert "a replay reads one run's files" in line


def test_an_exact_replay_checks_the_data_and_the_code(live_run, tmp_path):
    run = copy_of(live_run, tmp_path)
    summary = simulate("--replay", run, "--train", "--out", tmp_path / "exact")
    assert summary["simulation"]["exact_replay"] is True and summary["simulation"]["exact_replay_reason"] is None
    # the dataset file replaced: refused, or accepted and not exact (then put back, for the other tests)
    replaced = Path(json.loads((run / "summary.json").read_text())["config"]["data"]["path"])
    saved = replaced.read_bytes()
    try:
        data_file(replaced, seed=1)
        line = simulate("--replay", run, "--train", "--out", tmp_path / "data", code=2)
        assert "the dataset differs from the run's: it was d.h5 " in line and not (tmp_path / "data").exists()
        summary = simulate("--replay", run, "--train", "--out", tmp_path / "data", "--accept-mismatch", "data")
        assert summary["simulation"]["exact_replay"] is False and summary["simulation"]["recorded_order"] is True
        assert "the dataset differs" in summary["simulation"]["exact_replay_reason"]
    finally:
        replaced.write_bytes(saved)
    # another code version recorded
    doc = json.loads((run / "summary.json").read_text())
    doc["identity"]["code"] = "0.0.9+000000000000"
    (run / "summary.json").write_text(json.dumps(doc))
    line = simulate("--replay", run, "--train", "--out", tmp_path / "code", code=2)
    assert "the code version differs from the run's: it was 0.0.9+000000000000" in line
    summary = simulate("--replay", run, "--train", "--out", tmp_path / "code", "--accept-mismatch", "code")
    assert summary["simulation"]["exact_replay"] is False
    assert "the code version differs" in summary["simulation"]["exact_replay_reason"]
    # a run recorded before identities: no data or code to check against
    del doc["identity"]
    (run / "summary.json").write_text(json.dumps(doc))
    assert "it was not recorded" in simulate("--replay", run, "--train", "--out", tmp_path / "old", code=2)


def test_a_replay_under_another_job_is_not_called_exact(live_run, tmp_path):
    run = copy_of(live_run, tmp_path)
    summary = simulate("--replay", run, "--train", "--out", tmp_path / "lr", "--set", "optim.lr=0.01")
    sim = summary["simulation"]
    assert sim["recorded_order"] is True and sim["exact_replay"] is False
    assert sim["exact_replay_reason"] == "the job differs from the recorded one in optim.lr"


def test_a_summary_that_is_not_json_is_no_other_runs(single_run):
    run, _ = single_run
    (run / "summary.json").write_text("{not json")
    assert main(resume_args(run)) == 0  # it said the run id differed, "not recorded now"
    assert json.loads((run / "summary.json").read_text())["accepted_mismatch"] is None
