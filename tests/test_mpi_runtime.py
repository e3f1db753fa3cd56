"""The runtime inside MPI (run as ``mpiexec -n 3 python -m pytest --only-mpi``).

Each check that can fail on one rank alone is turned into a verdict every rank shares (a bcast from
the rank that knows), so the ranks fail together instead of leaving the others blocked.
"""

import os
import tempfile
import time

import numpy as np
import pytest

pytestmark = [pytest.mark.mpi(min_size=3), pytest.mark.timeout(120)]


@pytest.fixture
def ctx():
    from ebsp_mpi.runtime.rank.start import setup

    return setup()


def shared_tmpdir(ctx):
    path = tempfile.mkdtemp(prefix="ebsp-mpi-test-") if ctx.rank == 0 else None
    return ctx.comm.bcast(path, root=0)


def test_ranks_share_one_clock(ctx):
    ctx.comm.Barrier()
    t = ctx.now()
    times = ctx.comm.allgather(t)
    # after a barrier every rank reads nearly the same run time; loose bound: ranks oversubscribe cores
    assert max(times) - min(times) < 0.5
    assert t >= 0.0
    assert ctx.local_rank == ctx.comm.allgather(ctx.local_rank)[ctx.rank]
    if ctx.rank == 0:
        assert ctx.clock_offset == 0.0


def test_node_local_ranks_are_distinct_on_one_node(ctx):
    hosts = ctx.comm.allgather((ctx.host, ctx.local_rank))
    mine = [lr for h, lr in hosts if h == ctx.host]
    assert sorted(mine) == list(range(len(mine)))


def test_bsp_run_in_process_equals_the_single_process_oracle(ctx):
    """The whole runtime (server loop, persistent requests, policies) under pytest-mpi."""
    from ebsp_mpi import reference
    from ebsp_mpi.config import load_job
    from ebsp_mpi.outputs import read_model
    from ebsp_mpi.runtime.launch import run_mpi

    base = shared_tmpdir(ctx)
    overrides = ["sync.model=bsp", "stop.iterations=15", "straggler.enabled=false", "optim.weight_decay=1e-4"]
    job = load_job(None, overrides)
    code = run_mpi(job, os.path.join(base, "mpi"), show_progress=False, plan=None)
    verdict = None
    if ctx.rank == 0:
        from pathlib import Path

        oracle_dir = Path(base) / "oracle"
        oracle_dir.mkdir()
        reference.train(load_job(None, overrides + [f"sync.workers={ctx.workers}"]), oracle_dir, ctx.workers,
                    show_progress=False, plan=None)
        a, _ = read_model(Path(base) / "mpi" / "model.h5")
        b, _ = read_model(oracle_dir / "model.h5")
        verdict = max(float(np.abs(a[k] - b[k]).max()) for k in a) if sorted(a) == sorted(b) else "names differ"
    verdict = ctx.comm.bcast(verdict, root=0)
    assert code == 0
    assert verdict == pytest.approx(0.0, abs=1e-5)


def _started_server(ctx, job, run_dir):
    """Rank 0's server with every worker's initial weights sent (its loop not started)."""
    from pathlib import Path

    from ebsp_mpi.runtime.launch import make_role

    server = make_role(ctx, job, Path(run_dir), show_progress=False, plan=None)
    server._start_workers(0.0)
    return server


def _poll_until(server, done, deadline_s: float = 30.0) -> bool:
    """Run the server's push and reply polls until ``done(progressed)`` holds for a push poll's
    outcome (True), or the deadline passes (False; a guard against a hang, not a timing)."""
    deadline = time.monotonic() + deadline_s
    while time.monotonic() < deadline:
        progressed = server._serve_pushes()
        server.store.complete_replies()
        if done(progressed):
            return True
    return False


def _close(server) -> None:
    """Leave no receive posted and no reply sending behind."""
    from mpi4py import MPI

    for r in server.store.receives.recvs:
        if r.Test() is False:
            r.Cancel()
            r.Wait()
    for reply in server.store.replies:
        MPI.Request.Waitall(reply.requests)


def _worker_with_weights(ctx, job, run_dir):
    """A worker that has received its initial weights (its loop not started)."""
    from pathlib import Path

    from mpi4py import MPI

    from ebsp_mpi.runtime.launch import make_role

    worker = make_role(ctx, job, Path(run_dir), plan=None)
    MPI.Request.Waitall(worker.wire.dense.start_first_pull().requests)
    return worker


def test_a_poll_that_takes_part_of_a_push_reports_progress(ctx):
    """While the parts of a push arrive one by one, each poll that takes one reports progress, so the
    server loop polls again at once instead of sleeping between the parts (the back-off's sleeps
    once made BSP 4.4x slower); the push itself is acted on only once it is complete."""
    from mpi4py import MPI

    from ebsp_mpi.config import load_job

    # pushes as messages: on one node the server would otherwise read the gradient in place
    job = load_job(None, ["stop.iterations=5", "trace.enabled=false", "runtime.chunk_bytes=1024",
                          "runtime.shared_pushes=false"])
    run_dir = shared_tmpdir(ctx)
    verdict = None
    if ctx.rank == 0:
        server = _started_server(ctx, job, run_dir)
        first = server.layout.chunks[0]
        ctx.comm.bcast((first.tag, first.size), root=0)
        progressed = _poll_until(server, lambda progressed: progressed)
        receives = server.store.receives
        verdict = (progressed, sum(server.coordinator.pushes), int(receives.missing[0]), int(receives.parts_of[0]))
        _close(server)
    else:
        _worker_with_weights(ctx, job, run_dir)
        tag, size = ctx.comm.bcast(None, root=0)
        if ctx.rank == 1:  # the first chunk of a push, and nothing more: no header
            ctx.comm.Send([np.zeros(size, np.float32), MPI.FLOAT], 0, tag)
    progressed, pushes, missing, parts = ctx.comm.bcast(verdict, root=0)
    assert progressed, "a poll that took a chunk of a push reported no progress"
    assert pushes == 0 and missing == parts - 1  # one part taken, the push not acted on


def test_short_push_is_a_protocol_error_not_a_hang(ctx):
    """A message of the wrong size from a worker makes the server raise, naming the rank."""
    from mpi4py import MPI

    from ebsp_mpi.config import load_job
    from ebsp_mpi.runtime.transport.protocol import CHUNK_TAG0, ProtocolError

    job = load_job(None, ["stop.iterations=5", "trace.enabled=false", "runtime.shared_pushes=false"])
    run_dir = shared_tmpdir(ctx)
    message = None
    if ctx.rank == 0:
        server = _started_server(ctx, job, run_dir)
        try:
            _poll_until(server, lambda progressed: False)
        except ProtocolError as e:
            message = str(e)
        _close(server)
    else:  # a real worker receives the initial weights; then rank 1 sends a first chunk one value short
        _worker_with_weights(ctx, job, run_dir)
        if ctx.rank == 1:
            ctx.comm.Send([np.zeros(3, np.float32), MPI.FLOAT], 0, CHUNK_TAG0)
    message = ctx.comm.bcast(message, root=0)
    assert message is not None and "rank 1" in message and "expected" in message
