"""A job is resolved once per process: the OSDP plan file is read once, by the command line, and
every later user (the models, the layout, a worker's on-demand layers, the checkpoints, the summary)
takes it from the run description instead of reading the file again."""

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
    """Every read of a plan file from now on: parsed (``read_plan``) or digested (``plan_digest``)."""
    reads: list[str] = []
    read_plan, plan_digest = osdp_files.read_plan, checkpoint.plan_digest

    def counted_read(path, *args, **kwargs):
        reads.append(str(path))
        return read_plan(path, *args, **kwargs)

    def counted_digest(config):
        reads.append("digest")
        return plan_digest(config)

    monkeypatch.setattr(osdp_files, "read_plan", counted_read)
    monkeypatch.setattr(checkpoint, "plan_digest", counted_digest)
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
    assert plan_reads == [str(plan)]
    assert checkpoint.read_checkpoint(tmp_path / "run").plan_sha256 == read_osdp_plan(
        load_job(None, [f"osdp.plan={plan}"])).sha256


def test_a_worker_with_on_demand_layers_reads_no_plan_file(tmp_path, plan_reads):
    """The worker's model, its layout and its on-demand step (each read the file before) take the plan
    from the run description."""
    from ebsp_mpi.runtime.transport.context import Context
    from ebsp_mpi.runtime.launch import make_role

    plan = plan_file(tmp_path, (1, 0, 2))
    job = load_job(None, [HIDDEN, f"osdp.plan={plan}", "trace.enabled=false"])
    resolved = read_osdp_plan(job)
    assert plan_reads == [str(plan)]
    ctx = Context(comm=RecordingComm(), rank=1, size=3, local_rank=1, factor_comm=RecordingComm(),
                  fetch_comm=RecordingComm())
    worker = make_role(ctx, job, tmp_path, plan=resolved)
    assert worker.ondemand is not None and worker.peak is not None
    assert plan_reads == [str(plan)]


def test_the_run_description_holds_each_workers_iteration_limit():
    job = load_job(None, ["stop.iterations=0", "stop.epochs=1"])
    run = describe(job, 2, None)
    assert run.plan is None and run.plan_sha256 == ""
    assert run.limits == tuple(run.batch_stream(w).batches_per_epoch for w in range(2))
