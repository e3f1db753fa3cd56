"""A job is resolved once per process: the OSDP plan file is read once, by the command line, and
checked once, where the run is described; every later user (the models, the layout, a worker's
on-demand layers, the checkpoints, the summary) takes it from the run description instead of reading
or checking it again, and every role takes the layout of its messages from there too."""

from pathlib import Path

import pytest

from ebsp_mpi import build, checkpoint, cli
from ebsp_mpi.config import load_job
from ebsp_mpi.plan import osdp_files
from ebsp_mpi.run_description import describe, read_osdp_plan
from test_gpu_paths import RecordingComm
from test_osdp_runtime import write_plan

HIDDEN = "model.hidden=[16, 8]"


@pytest.fixture
def plan_reads(monkeypatch) -> list[str]:
    """Every read of a plan file from now on (``read_plan``), and every check of a plan against a
    model (``check_plan``, as ``"check"``)."""
    reads: list[str] = []
    read_plan, check_plan = osdp_files.read_plan, osdp_files.check_plan

    def counted_read(path, *args, **kwargs):
        reads.append(str(path))
        return read_plan(path, *args, **kwargs)

    def counted_check(*args, **kwargs):
        reads.append("check")
        return check_plan(*args, **kwargs)

    monkeypatch.setattr(osdp_files, "read_plan", counted_read)
    monkeypatch.setattr(osdp_files, "check_plan", counted_check)
    return reads


def plan_file(tmp_path: Path, choices) -> Path:
    job = load_job(None, [HIDDEN])
    path = tmp_path / "plan.json"
    write_plan(path, build.model(job, build.dataset(job)), choices)
    return path


def test_the_reference_trainer_reads_the_plan_once(tmp_path, plan_reads):
    """World size 1, a plan with every layer resident: the command line reads it; the model, its
    checks, every checkpoint and the summary reuse what it read."""
    plan = plan_file(tmp_path, (0, 0, 0))
    code = cli.main(["train", "-q", "--out", str(tmp_path / "run"), "--set", HIDDEN, "--set", f"osdp.plan={plan}",
                     "--set", "stop.iterations=3", "--set", "trace.enabled=false"])
    assert code == 0
    assert plan_reads == [str(plan), "check"]
    assert checkpoint.read_checkpoint(tmp_path / "run").plan_sha256 == read_osdp_plan(
        load_job(None, [f"osdp.plan={plan}"])).sha256


def test_a_worker_with_on_demand_layers_reads_no_plan_file_and_checks_it_once(tmp_path, plan_reads):
    """The worker's model, its layout and its on-demand step (each read the file before) take the plan
    from the run description, which checked it against the model once (the model and the layout
    checked it again, each)."""
    from ebsp_mpi.runtime.transport.context import Context
    from ebsp_mpi.runtime.launch import make_role

    plan = plan_file(tmp_path, (1, 0, 2))
    job = load_job(None, [HIDDEN, f"osdp.plan={plan}", "trace.enabled=false"])
    resolved = read_osdp_plan(job)
    assert plan_reads == [str(plan)]
    ctx = Context(comm=RecordingComm(), rank=1, size=3, local_rank=1, factor_comm=RecordingComm(),
                  fetch_comm=RecordingComm())
    worker = make_role(ctx, job, tmp_path, plan=resolved)
    assert worker.wire.ondemand is not None and worker.peak is not None
    assert plan_reads == [str(plan), "check"]


def test_a_role_takes_its_layout_from_the_run_description(tmp_path):
    """The launch works out the layout once, into the description every role is given; a role makes
    none of its own."""
    from ebsp_mpi.runtime.launch import make_role
    from ebsp_mpi.runtime.transport.context import Context

    job = load_job(None, [HIDDEN, "trace.enabled=false", "runtime.chunk_bytes=1024"])
    ctx = Context(comm=RecordingComm(), rank=1, size=3, local_rank=1, factor_comm=RecordingComm(),
                  fetch_comm=RecordingComm())
    worker = make_role(ctx, job, tmp_path, plan=None)
    assert worker.wire.dense.chunks is worker.description.layout.chunks  # the wire is made from it
    assert len(worker.description.layout.chunks) > 1  # runtime.chunk_bytes = 1024 cuts the push in pieces


def test_a_checkpoint_records_the_plan_digest_the_run_read(tmp_path):
    """Writing a checkpoint never digests the plan file again: what it records is what the run read
    (a file changed since is for the resume to refuse, against the digest of the run's start)."""
    from test_checkpoint import checkpoint_of

    plan = tmp_path / "plan.json"
    plan.write_text("{}")
    ckpt = checkpoint_of([f"osdp.plan={plan}"])
    checkpoint.write_checkpoint(tmp_path, ckpt)
    assert ckpt.plan_sha256 == "" and checkpoint.read_checkpoint(tmp_path).plan_sha256 == ""


def test_a_job_naming_a_plan_is_not_described_without_it():
    """A caller that forgot to read the plan would train without it, silently."""
    job = load_job(None, ["osdp.plan=plan.json"])
    with pytest.raises(ValueError, match="was not read"):
        describe(job, 2, None)


def test_the_run_description_holds_each_workers_iteration_limit():
    job = load_job(None, ["stop.iterations=0", "stop.epochs=1"])
    run = describe(job, 2, None)
    assert run.plan is None and run.plan_sha256 == ""
    assert run.limits == tuple(run.batch_stream(w).batches_per_epoch for w in range(2))
