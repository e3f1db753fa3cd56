"""The code that only a GPU runs, run on a CPU with a fake device (tests/fakecupy.py).

A real GPU run (marker ``gpu``, and ``.ci/gpu-check.sh``) is the final word; these tests make a
regression in the GPU-only paths show on every machine:

- **device choice**: a rank's device is its node-local rank modulo the device count, chosen before
  its first allocation;
- **staging** (``runtime.cuda_aware_mpi = false``): MPI sends and receives host mirrors; each gradient
  chunk is copied device -> host once, before its send; the pulled weights are copied host -> device;
- **CUDA-aware MPI** (``runtime.cuda_aware_mpi = true``): MPI reads the device buffers themselves, and
  the stream is synchronised before every send (or MPI would read a gradient still being computed);
- **a whole run**: ``mpiexec -n 3 python -m ebsp_mpi train --set backend=cupy`` under BSP, staged or
  CUDA-aware, with wait-free backprop on and off, equals the single-process NumPy oracle.
"""

import json
from pathlib import Path

import numpy as np
import pytest

import fakecupy
from ebsp_mpi.backend import resolve_backend
from ebsp_mpi.nn import build_model
from ebsp_mpi.outputs import read_model
from mpirun import max_abs_difference, oracle_run, train

@pytest.fixture
def device(monkeypatch):
    """The fake CuPy, installed as ``cupy`` for one test, with two devices; yields its counters' holder."""
    monkeypatch.setenv(fakecupy.DEVICES_ENV, "2")
    monkeypatch.delenv("EBSP_BACKEND", raising=False)
    fakecupy.install(monkeypatch)
    return fakecupy


# -- device choice ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("devices", [1, 2, 3])
@pytest.mark.parametrize("local_rank", range(5))
def test_the_device_is_the_node_local_rank_modulo_the_device_count(device, monkeypatch, devices, local_rank):
    monkeypatch.setenv(fakecupy.DEVICES_ENV, str(devices))
    b = resolve_backend("cupy", local_rank=local_rank, env={})
    assert b.name == "cupy" and b.device == local_rank % devices
    assert device.state.device == b.device  # made current, so that what follows is allocated there
    model = build_model("mlp", (1, 8, 8), 4, hidden=(16,), xp=b.xp, dtype=np.float32, seed=0)
    assert isinstance(model.space.data, device.ndarray) and device.state.devices_used == {b.device}
    assert b.describe() == f"cupy:{b.device} (Fake CUDA device {b.device})"


def test_auto_takes_the_device_and_the_environment_still_overrides(device):
    assert resolve_backend("auto", local_rank=1, env={}).name == "cupy"
    assert resolve_backend("cupy", local_rank=1, env={"EBSP_BACKEND": "numpy"}).name == "numpy"


@pytest.mark.parametrize("kind", ["mlp", "cnn"])
def test_the_network_on_the_fake_device_equals_numpy(device, kind):
    """The fake is faithful enough to train on: the same loss and gradient as NumPy, on the device."""
    rng = np.random.default_rng(0)
    x, y = rng.normal(size=(8, 1, 8, 8)), rng.integers(0, 4, size=8)
    ref = build_model(kind, (1, 8, 8), 4, hidden=(16,), channels=(3, 4), dtype=np.float64, seed=5)
    dev = build_model(kind, (1, 8, 8), 4, hidden=(16,), channels=(3, 4), xp=device, dtype=np.float64, seed=5)
    assert dev.loss_and_grad(device.asarray(x), device.asarray(y)) == pytest.approx(ref.loss_and_grad(x, y), rel=1e-12)
    assert isinstance(dev.space.grad, device.ndarray)
    np.testing.assert_allclose(device.asnumpy(dev.space.grad), ref.space.grad, rtol=1e-9, atol=1e-12)


def test_the_fake_refuses_what_a_gpu_refuses(device):
    a = device.asarray(np.ones(4, dtype=np.float32))
    with pytest.raises(TypeError, match="mixes a device array"):
        np.add(a, np.ones(4, dtype=np.float32))
    device.state.pending = False
    a *= 2
    assert device.state.pending  # a kernel is queued until the stream is synchronised
    device.cuda.get_current_stream().synchronize()
    assert not device.state.pending and device.state.synchronizes == 1


def test_the_fakes_memory_pool_keeps_every_block_until_its_free_blocks_are_dropped(device):
    """What runtime/worker/peak.py reads on a GPU: the pool's total is the most it held at once."""
    pool = device.get_default_memory_pool()
    pool.free_all_blocks()
    used = pool.used_bytes()
    assert pool.total_bytes() == used
    a = device.zeros(1000, dtype=np.float32)  # 4000 bytes: a block of 4096
    b = a * 2  # a fresh result, a block of its own
    view = a[10:]  # shares a's block
    assert pool.used_bytes() == pool.total_bytes() == used + 2 * 4096
    del a, b  # the view keeps a's block in use; b's is cached
    assert pool.used_bytes() == used + 4096 and pool.total_bytes() == used + 2 * 4096
    pool.free_all_blocks()
    assert pool.total_bytes() == used + 4096 and view.size == 990


# -- one worker's messages, with a recording communicator ----------------------------------------------


class Recorded:
    """A persistent request that records, at each ``Start``, what MPI would read from its buffer then."""

    def __init__(self, log, kind, buf, peer, tag):
        self.log, self.kind, self.buf, self.peer, self.tag = log, kind, buf, peer, tag

    def Start(self):
        state = fakecupy.state
        host = self.buf.view(np.ndarray) if isinstance(self.buf, fakecupy.ndarray) else self.buf
        self.log.append(dict(request=self, values=np.array(host, copy=True), pending=state.pending,
                             d2h_bytes=state.d2h_bytes))


class RecordingComm:
    """Just what a worker's constructor asks of its communicator; every request records its starts."""

    def __init__(self):
        self.log, self.requests = [], []

    def Get_attr(self, key):
        return 2**21  # MPI.TAG_UB's guaranteed minimum is far lower; any value past the chunk count does

    def _request(self, kind, spec, peer, tag):
        r = Recorded(self.log, kind, spec[0], peer, tag)
        self.requests.append(r)
        return r

    def Send_init(self, spec, dest, tag):
        return self._request("send", spec, dest, tag)

    def Recv_init(self, spec, source, tag):
        return self._request("recv", spec, source, tag)


def make_worker(tmp_path, *overrides):
    """Worker 0 (rank 1 of 3, one server) of a small MLP job on the fake device, chunks of 1 KiB."""
    from ebsp_mpi.config import load_job
    from ebsp_mpi.runtime.transport.context import Context
    from ebsp_mpi.runtime.launch import make_role

    job = load_job(None, ["backend=cupy", "trace.enabled=false", "runtime.chunk_bytes=1024", *overrides])
    comm = RecordingComm()
    ctx = Context(comm=comm, rank=1, size=3, local_rank=1, factor_comm=RecordingComm())
    return make_role(ctx, job, tmp_path, plan=None), comm


def push_once(worker):
    """One iteration's gradient and push of its chunks, as ``Worker.run`` does them; the number of
    chunk sends started before the backward pass returned."""
    worker.wire.dense.begin_push()
    worker.wire.finite.reset()
    model, during = worker.model, []
    backward = model.loss_and_grad

    def watched(*args, **kwargs):
        loss = backward(*args, **kwargs)
        during.append(len(worker.ctx.comm.log))
        return loss

    model.loss_and_grad = watched
    worker.compute_gradient()
    worker.wire.dense.push_rest()
    return during[0]


def chunk_sends(worker, comm):
    chunk_requests = {id(r): k for k, r in worker.wire.dense.pushes.items()}
    return [(chunk_requests[id(e["request"])], e) for e in comm.log if id(e["request"]) in chunk_requests]


@pytest.mark.parametrize("wfbp", [False, True], ids=["after-backward", "wait-free"])
def test_a_staged_push_copies_each_chunk_to_the_host_before_its_send(device, tmp_path, wfbp):
    worker, comm = make_worker(tmp_path, f"runtime.wait_free_backprop={str(wfbp).lower()}")
    assert worker.wire.buffers.staged and len(worker.wire.dense.chunks) > 4
    # MPI touches host memory only: the mirrors, not the device's buffers
    assert all(type(r.buf) is np.ndarray for r in comm.requests)
    assert type(worker.wire.buffers.grad) is np.ndarray and type(worker.wire.buffers.params) is np.ndarray
    assert isinstance(worker.model.space.grad, device.ndarray)
    worker.wire.buffers.grad[...] = np.nan  # what a send of a chunk not copied yet would carry
    before = device.state.d2h_bytes
    started_in_backward = push_once(worker)
    staged_bytes = device.state.d2h_bytes - before
    sends = chunk_sends(worker, comm)
    assert sorted(k for k, _ in sends) == list(range(len(worker.wire.dense.chunks)))  # each chunk once
    grad = device.asnumpy(worker.model.space.grad)
    copied = before
    for k, e in sends:
        c = worker.wire.dense.chunks[k]
        np.testing.assert_array_equal(e["values"], grad[c.start:c.stop])  # the final gradient, copied
        copied += c.size * 4
        assert e["d2h_bytes"] >= copied  # by a device-to-host copy, not read from the device's memory
    assert staged_bytes == grad.nbytes  # every chunk copied once, nothing more
    assert (started_in_backward > 0) == wfbp


@pytest.mark.parametrize("wfbp", [False, True], ids=["after-backward", "wait-free"])
def test_cuda_aware_sends_read_the_device_buffers_after_a_synchronize(device, tmp_path, wfbp):
    worker, comm = make_worker(tmp_path, "runtime.cuda_aware_mpi=true",
                               f"runtime.wait_free_backprop={str(wfbp).lower()}")
    assert not worker.wire.buffers.staged
    space = worker.model.space
    pushes, pulls = list(worker.wire.dense.pushes.values()), worker.wire.dense.first.requests[1:]
    chunk_bufs = [r.buf for r in pushes] + [r.buf for r in pulls]
    assert all(isinstance(b, device.ndarray) for b in chunk_bufs)  # MPI reads and writes the device
    assert all(np.shares_memory(r.buf, space.grad) for r in pushes)
    assert all(np.shares_memory(r.buf, space.data) for r in pulls)
    before = device.state.d2h_bytes
    started_in_backward = push_once(worker)
    sends = chunk_sends(worker, comm)
    assert sorted(k for k, _ in sends) == list(range(len(worker.wire.dense.chunks)))
    assert not any(e["pending"] for _, e in sends)  # no kernel still writing what MPI reads
    grad = space.grad.view(np.ndarray)
    for k, e in sends:
        c = worker.wire.dense.chunks[k]
        np.testing.assert_array_equal(e["values"], grad[c.start:c.stop])
    assert device.state.d2h_bytes == before  # no staging copies
    assert (started_in_backward > 0) == wfbp


# -- whole runs ------------------------------------------------------------------------------------------

ORACLE = ["sync.model=bsp", "stop.iterations=30", "optim.momentum=0.9", "straggler.enabled=false",
          "runtime.chunk_bytes=4096"]


@pytest.fixture(scope="module")
def oracle(tmp_path_factory) -> Path:
    """The single-process NumPy oracle of ``ORACLE`` with 2 workers, run once for both runs."""
    return oracle_run(tmp_path_factory, "sync.workers=2", *ORACLE)


@pytest.mark.slow
@pytest.mark.timeout(400)
@pytest.mark.parametrize("wire", [["runtime.wait_free_backprop=false"],
                                  ["runtime.wait_free_backprop=true", "runtime.cuda_aware_mpi=true"]],
                         ids=["staged", "cuda-aware-wfbp"])
def test_bsp_on_the_fake_device_equals_the_numpy_oracle(tmp_path, oracle, wire):
    reports = tmp_path / "reports"
    reports.mkdir()
    p = train(3, tmp_path / "gpu", "backend=cupy", *wire, *ORACLE, timeout=180,
              extra_env=fakecupy.child_env(devices=2, report=reports))
    assert p.returncode == 0, p.stderr
    assert max_abs_difference(tmp_path / "gpu", oracle) <= 1e-5
    gpu, _ = read_model(tmp_path / "gpu" / "model.h5")

    summary = json.loads((tmp_path / "gpu" / "summary.json").read_text())
    assert "cupy:" in json.dumps(summary)  # the workers say which device they trained on
    by_rank = {int(r["rank"]): r for r in (json.loads(f.read_text()) for f in reports.glob("*.json"))}
    workers = {rank: r for rank, r in by_rank.items() if rank >= 1}
    assert sorted(workers) == [1, 2]
    for rank, r in workers.items():  # one node: the node-local rank is the rank
        assert r["device"] == rank % 2 and r["devices_used"] == [rank % 2]
    nbytes = sum(a.size for a in gpu.values()) * 4
    iterations = 30
    for r in workers.values():
        if "cuda_aware_mpi=true" in " ".join(wire):
            assert r["d2h_bytes"] < nbytes  # no staging (a few scalars at most)
        else:  # every pull copied in, every push copied out
            assert r["h2d_bytes"] >= iterations * nbytes and r["d2h_bytes"] >= iterations * nbytes


def test_bsp_with_factors_steps_the_layers_the_same_staged_or_on_the_device(device, tmp_path):
    """BSP with ``comm.hybrid = sfb``: each worker steps the SFB layers itself, with the host optimizer.
    With CUDA-aware MPI the weights it steps live on the device (``params_buf`` is the device buffer),
    and the step must reach them there, equal to the staged worker's step on its host mirror."""
    from ebsp_mpi.runtime.transport.protocol import PULL_FIELDS

    stepped = {}
    for cuda_aware in ("false", "true"):
        worker, _ = make_worker(tmp_path / cuda_aware, "comm.hybrid=sfb", "sync.model=bsp",
                                f"runtime.cuda_aware_mpi={cuda_aware}")
        factors, buffers = worker.wire.factors, worker.wire.buffers
        assert factors.bsp and factors.layers
        if buffers.staged:  # the pulled weights, as the first pull leaves them in the host mirror
            buffers.params[...] = device.asnumpy(worker.model.space.data)
        factors.opt._fused_step = None  # a real device array gives Numba no buffer: the ufunc path
        rng = np.random.default_rng(1)
        for a in factors.layers:
            factors.stacked.V[a.name][...] = rng.normal(size=factors.stacked.V[a.name].shape)
            factors.stacked.U[a.name][...] = rng.normal(size=factors.stacked.U[a.name].shape)
        header = worker.wire.dense.pull_header
        header[len(PULL_FIELDS):] = 1  # both workers are members of the round
        before = device.asnumpy(worker.model.space.data)
        factors.step(header, 0)
        weights = buffers.params.copy() if buffers.staged else device.asnumpy(buffers.params)
        for a in factors.layers:
            assert not np.array_equal(weights[a.params], before[a.params])  # the step was taken
        stepped[cuda_aware] = weights
    np.testing.assert_array_equal(stepped["true"], stepped["false"])
