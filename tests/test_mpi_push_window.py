"""The node's window of pushes (``runtime.transport.push_window``) inside MPI (run as ``mpiexec -n 3
python -m pytest --only-mpi``): rank 0 a server, ranks 1 and 2 workers on one node.

Each verdict is shared by every rank (an allgather of what each saw), so the ranks fail together
instead of leaving the others blocked.
"""

from types import SimpleNamespace

import numpy as np
import pytest

from ebsp_mpi.runtime.transport import push_window
from ebsp_mpi.runtime.transport.protocol import Chunk

pytestmark = [pytest.mark.mpi(min_size=3), pytest.mark.timeout(120)]

ELEMENTS = 1000


@pytest.fixture
def ctx():
    from ebsp_mpi.runtime.rank.start import setup

    ctx = setup()
    ctx.servers = 1
    return ctx


def layout(**changes):
    """The part of a run's layout the window reads: its chunks (the model's size), SFB layers and OSDP
    schedule."""
    return SimpleNamespace(**{"chunks": [Chunk(0, 600, 100), Chunk(600, ELEMENTS, 101)], "sfb": [],
                              "schedule": None, **changes})


def everyone(ctx, ok: bool) -> bool:
    return all(ctx.comm.allgather(bool(ok)))


def test_a_worker_writes_its_gradient_and_the_server_reads_it_in_place(ctx):
    if len(set(ctx.comm.allgather(ctx.host))) > 1:
        pytest.skip("the ranks are on several nodes")
    window = push_window.open_push_window(ctx, layout(), [0], not ctx.is_server, 60.0)
    try:
        assert everyone(ctx, window is not None)
        workers = list(range(1, ctx.size))
        assert everyone(ctx, sorted(window.gradients) == workers
                        and all(window.servers_reading(r) == [0] for r in workers)
                        and sorted(window.read_by(0)) == workers and window.read_by(1) == {}
                        and all(g.size == ELEMENTS and g.dtype == np.float32 for g in window.gradients.values()))
        if not ctx.is_server:  # each worker writes its gradient, then says so (as its header would)
            window.gradients[ctx.rank][:] = ctx.rank + np.arange(ELEMENTS, dtype=np.float32)
            window.sync()
        ctx.comm.Barrier()
        seen = True
        if ctx.is_server:
            window.sync()
            seen = all(np.array_equal(g, r + np.arange(ELEMENTS, dtype=np.float32))
                       for r, g in window.read_by(0).items())
        assert everyone(ctx, seen)
    finally:
        ctx.comm.Barrier()
        if window is not None:
            window.close()


def test_every_rank_of_the_node_says_no_alike(ctx, monkeypatch):
    """No room on the node, a rank whose set-up failed, a run with SFB layers, no server that reads in
    place, gradients in device memory: no window, and no rank left waiting in a collective."""
    monkeypatch.setattr(push_window, "_room", lambda: 0.0)
    assert everyone(ctx, push_window.open_push_window(ctx, layout(), [0], True, 60.0) is None)
    monkeypatch.undo()
    failed = None if ctx.rank == ctx.size - 1 else layout()
    assert everyone(ctx, push_window.open_push_window(ctx, failed, [0], True, 60.0) is None)
    # a run with SFB layers, or no server that reads in place (it streams its rounds): no rank keeps
    # its gradient in a window, and none is opened
    assert everyone(ctx, push_window.open_push_window(ctx, layout(sfb=["dense1.W"]), [0], True, 60.0) is None)
    assert everyone(ctx, push_window.open_push_window(ctx, layout(), [], True, 60.0) is None)
    assert everyone(ctx, push_window.open_push_window(ctx, layout(), [0], False, 60.0) is None)  # device gradients
