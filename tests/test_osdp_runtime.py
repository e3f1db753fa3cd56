"""OSDP plans, run: on-demand and split layers in the worker (``nn.ondemand``, ``plan.osdp_schedule``,
``runtime.transport.fetch``).

The pure part is checked against :meth:`Model.loss_and_grad` on whole models, with a transport that
copies units in and out of the fetch buffer the way the worker's messages do. The runs check that
BSP with on-demand layers equals the single-process oracle (<= 1e-5), that every other sync model
trains with them, that a worker holds only what the plan says (its measured peak against the bytes
of its buffers), and that what cannot run is one line before training.
"""

from __future__ import annotations

import itertools
import json
import os
import signal
import tracemalloc
from pathlib import Path

import numpy as np
import pytest

from ebsp_mpi import build
from ebsp_mpi.config import load_job
from ebsp_mpi.nn.layers import Conv2D, Dense
from ebsp_mpi.nn.model import build_model
from ebsp_mpi.nn.ondemand import OnDemandStep, Transport
from ebsp_mpi.nn.params import ParamSpace, TensorSpec
from ebsp_mpi.plan.osdp import Block, CostModel, memory
from ebsp_mpi.plan.osdp_files import PLAN_FORMAT, SHAPE_KEYS, VERSION, OsdpFileError, model_layers
from ebsp_mpi.plan.osdp_schedule import make_schedule, on_demand_tensors
from ebsp_mpi.runtime.transport.layout import Layout, _cut
from ebsp_mpi.runtime.transport.protocol import Chunk
from ebsp_mpi.runtime.worker.peak import IterationTimes, pool_bound
from cliutil import one_line_error
from mpirun import max_abs_difference, oracle_run, signal_rank_mid_run, train


def write_plan(path: Path, model, choices, overlap: bool = False, batch: int = 32) -> dict:
    """A plan file for `model`: per layer with parameters 0 (resident), 1 (on demand) or s (slices),
    its buffer exactly what the units need."""
    layers = []
    for entry, s in zip([e for e in model_layers(model) if e["params"]], choices, strict=True):
        rows = [len(r) for r in np.array_split(np.arange(entry["rows"]), s)] if s else []
        layers.append({"name": entry["name"], "tensors": entry["tensors"], "params": entry["params"],
                       "mode": "on-demand" if s else "resident", "slices": max(s, 1), "slice_rows": rows,
                       "slice_bytes": []})
    plan = {"format": PLAN_FORMAT, "version": VERSION, "batch_size": batch, "layers": layers,
            "buffer_bytes": 1 << 40, "network": {"overlap": overlap}, "predicted": {}}
    plan["buffer_bytes"] = 4 * make_schedule(plan, model).buffer_elems
    path.write_text(json.dumps(plan))
    return plan


class CopyTransport(Transport):
    """Units copied from a whole model's weights into the buffer, gradients copied back out; a unit's
    place must not be written while the item before still computes with its own."""

    def __init__(self, sched, weights, grad):
        self.sched, self.weights, self.grad = sched, weights, grad
        self.buffer = np.full(sched.buffer_elems, np.nan, dtype=weights.dtype)
        self.pending: set[int] = set()
        self.fetches = 0

    def _runs(self, i):
        item = self.sched.items[i]
        at = item.at
        for a, b in self.sched.units[item.unit].runs:
            yield at, a, b
            at += b - a

    def fetch(self, i):
        for at, a, b in self._runs(i):
            self.buffer[at:at + b - a] = self.weights[a:b]
        self.pending.add(i)
        self.fetches += 1

    def arrived(self, i):
        assert i in self.pending, f"item {i} computes with a unit never fetched"
        self.pending.discard(i)

    def push(self, i):
        for at, a, b in self._runs(i):
            self.grad[a:b] = self.buffer[at:at + b - a]


MODELS = {
    "mlp": dict(kind="mlp", in_shape=(20,), hidden=(16, 12), plans=[(0, 0, 0), (1, 0, 1), (2, 3, 1), (4, 4, 2),
                                                                  (0, 2, 0), (1, 1, 1), (0, 0, 5)]),
    "cnn": dict(kind="cnn", in_shape=(2, 6, 6), hidden=(16,), plans=[(1, 0, 0, 1), (0, 1, 1, 2), (1, 1, 1, 1),
                                                                    (2, 0, 0, 0), (3, 4, 1, 2), (0, 2, 0, 1)]),
}


def _model(spec, resident=None):
    return build_model(spec["kind"], spec["in_shape"], 5, hidden=spec["hidden"], channels=(3, 4), seed=1,
                       dtype=np.float64, resident=resident)


@pytest.mark.parametrize("overlap", [False, True], ids=["fetch-when-reached", "prefetch"])
@pytest.mark.parametrize("name", sorted(MODELS))
def test_on_demand_steps_equal_the_whole_models_loss_and_gradient(name, overlap, tmp_path):
    spec = MODELS[name]
    whole = _model(spec)
    rng = np.random.default_rng(0)
    x, y = rng.normal(size=(7, *spec["in_shape"])), rng.integers(0, 5, 7)
    loss = whole.loss_and_grad(x, y)
    for choices in spec["plans"]:
        plan = write_plan(tmp_path / "plan.json", whole, choices, overlap, batch=7)
        held = [v.name for v in whole.space.tensors if v.name not in on_demand_tensors(plan)]
        model = _model(spec, resident=held)
        assert model.space.data.size == sum(whole.space.view(t).size for t in held)
        sched = make_schedule(plan, model)
        grad = np.full(whole.space.size, np.nan)
        transport = CopyTransport(sched, whole.space.data, grad)
        reported = set()
        step = OnDemandStep(model, sched, 7)
        got = step.loss_and_grad(x, y, transport, on_grad_ready=lambda t, n, seen=reported: seen.add(t))
        for t in held:
            v = whole.space.view(t)
            grad[v.offset:v.offset + v.size] = model.space.grad_of(t).ravel()
        assert abs(got - loss) <= 1e-12, choices
        assert np.abs(grad - whole.space.grad).max() <= 1e-12, choices  # NaN (a gap) fails too
        assert sorted(reported) == sorted(held)  # wait-free backprop hears of every resident tensor
        assert not transport.pending
        assert transport.fetches == sum(it.fetched for it in sched.items)



@pytest.mark.parametrize("layer, in_shape", [(lambda: Dense(7), (10,)),
                                             (lambda: Conv2D(5, 3, padding=1), (3, 6, 7)),
                                             (lambda: Conv2D(6, (3, 2), stride=2, padding=(1, 0)), (2, 7, 8))],
                         ids=["dense", "conv-wide", "conv-strided"])
def test_a_layer_in_slices_equals_the_whole_layer(layer, in_shape):
    """``forward_slice`` and ``backward_slice`` (last slice first) against ``forward`` and ``backward``:
    the output, dW and db, and dx (or none) for every slice count."""
    rng = np.random.default_rng(3)
    whole, sliced = layer(), layer()
    specs, out_shape = whole.build(in_shape, "l")
    sliced.build(in_shape, "l")
    space = ParamSpace(specs, dtype=np.float64)
    space.init(1)
    whole.bind(space)
    sliced.xp = np
    W, b = space.param("l.W"), space.param("l.b")
    x, dy = rng.normal(size=(4, *in_shape)), rng.normal(size=(4, *out_shape))
    y = whole.forward(x, True)
    dx = whole.backward(dy, need_dx=True)
    rows = W.shape[0]  # a slice is whole rows of W: Dense's inputs, Conv2D's output channels
    conv = isinstance(sliced, Conv2D)
    for s, need_dx in itertools.product(range(1, rows + 1), (True, False)):
        bounds = np.cumsum([0] + [len(r) for r in np.array_split(np.arange(rows), s)])
        units = [(W[a:c].ravel().copy(), b[a:c].copy() if conv else b.copy() if c == rows else b[:0].copy())
                 for a, c in itertools.pairwise(bounds)]
        temp = np.empty(x.shape[0] * b.size)
        got = [sliced.forward_slice(x, w_k, b_k, int(a), temp) for (w_k, b_k), a in zip(units, bounds, strict=False)]
        assert all(g is None for g in got[:-1]) and np.abs(got[-1] - y).max() <= 1e-12, s
        back = [sliced.backward_slice(dy, *units[k], int(bounds[k]), need_dx) for k in reversed(range(s))]
        assert all(g is None for g in back[:-1])
        assert np.abs(np.concatenate([w_k for w_k, _ in units]) - space.grad_of("l.W").ravel()).max() <= 1e-12, s
        assert np.abs(np.concatenate([b_k for _, b_k in units]) - space.grad_of("l.b")).max() <= 1e-12, s
        assert back[-1] is None if not need_dx else np.abs(back[-1] - dx).max() <= 1e-12, s


#: What tracemalloc also sees of a step beyond arrays: its Python objects (views into the fetch buffer,
#: layers bound to them), a few hundred bytes.
OBJECTS = 4096


def _traced_peak(step) -> int:
    """Bytes `step()` allocates at its peak above what was allocated before (its second run: the
    first one warms caches)."""
    step()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        tracemalloc.reset_peak()
        step()
        return tracemalloc.get_traced_memory()[1] - before
    finally:
        tracemalloc.stop()


@pytest.mark.parametrize("kind", ["mlp", "cnn"])
def test_an_on_demand_step_holds_no_more_than_the_plans_activations_and_input_gradient(kind, tmp_path):
    """The planner's A(b) is a resident step's, measured; an on-demand layer computes its input
    gradient before dW overwrites its weights, so it also holds that beside its input: the plan's
    ``input_grad`` term. A step of any plan stays under the two (the split temporary and the fetch
    buffer are allocated before it)."""
    in_shape, hidden, plans = ((96,), (160, 128, 96), [(0, 1, 0, 0), (1, 0, 1, 0), (0, 2, 4, 1), (1, 1, 1, 1)]) \
        if kind == "mlp" else ((3, 12, 12), (64,), [(1, 0, 0, 0), (0, 1, 0, 0), (1, 1, 1, 1), (0, 0, 0, 2),
                                                    (2, 0, 0, 0), (0, 4, 0, 0), (2, 4, 2, 2)])
    spec = dict(kind=kind, in_shape=in_shape, hidden=hidden)
    batch, whole = 32, _model(spec)
    rng = np.random.default_rng(0)
    x, y = rng.normal(size=(batch, *in_shape)), rng.integers(0, 5, batch)
    activations = _traced_peak(lambda: whole.loss_and_grad(x.copy(), y.copy()))
    blocks = tuple(Block(e["name"], *(e[k] for k in SHAPE_KEYS), 0.0, 0.0)
                   for e in model_layers(whole) if e["params"])
    cm = CostModel(batch, blocks, 0.0, 0.0, activations, 0.0, 1e9, whole.space.dtype.itemsize)
    grown = []
    for choices in plans:
        plan = write_plan(tmp_path / "plan.json", whole, choices, batch=batch)
        model = _model(spec, resident=[v.name for v in whole.space.tensors if v.name not in on_demand_tensors(plan)])
        sched = make_schedule(plan, model)
        step, transport = OnDemandStep(model, sched, batch), CopyTransport(sched, whole.space.data,
                                                                            np.zeros(whole.space.size))
        peak = _traced_peak(lambda: step.loss_and_grad(x.copy(), y.copy(), transport))  # noqa: B023
        m = memory(cm, choices)
        assert peak <= m.activations + m.input_grad + OBJECTS, (choices, peak, m)
        grown.append(peak - activations)
    if kind == "mlp":  # without the input gradient term, some plan would exceed A(b); a Conv2D's term
        assert max(grown) > OBJECTS  # is 0 (its column buffers are kept whatever the order), and holds


def test_the_schedule_fetches_each_unit_for_its_forward_and_backward_and_keeps_the_last():
    model = _model(MODELS["mlp"])
    sched = make_schedule({"layers": write_plan(Path("/dev/null"), model, (2, 0, 3))["layers"],
                           "buffer_bytes": 1 << 40}, model)
    assert [(it.kind, it.block) for it in sched.items] == [
        ("prefix", None), ("forward", 0), ("forward", 0), ("forward", 1), ("forward", 2), ("forward", 2),
        ("forward", 2), ("backward", 2), ("backward", 2), ("backward", 2), ("backward", 1), ("backward", 0),
        ("backward", 0)]
    kept = [it for it in sched.items if it.kept]
    assert len(kept) == 1 and sched.units[kept[0].unit].k == 2  # the last block's last slice
    # the units of a layer cover its W and b exactly once
    space = model.space
    for j, names in ((0, ("dense1.W", "dense1.b")), (2, ("dense3.W", "dense3.b"))):
        covered = sorted(r for u in sched.units if u.block == j for r in u.runs)
        lo, hi = space.view(names[0]).offset, space.view(names[1]).offset + space.view(names[1]).size
        assert covered[0][0] == lo and covered[-1][1] == hi
        assert all(a[1] == b[0] for a, b in itertools.pairwise(covered))
    # adjacent units never share a place, and every place fits the buffer
    places = [(it.at, it.at + sched.units[it.unit].elems) if it.unit is not None else None for it in sched.items]
    for k in range(len(places) - 1):
        a, b = places[k], places[k + 1]
        assert a is None or a[1] <= sched.buffer_elems
        if a and b and not sched.items[k + 1].kept:
            assert a[1] <= b[0] or b[1] <= a[0], (k, a, b)


def test_a_plan_whose_buffer_is_too_small_is_refused(tmp_path):
    for name, choices in (("mlp", (2, 2, 0)), ("cnn", (2, 3, 0, 0))):
        model = _model(MODELS[name])
        plan = write_plan(tmp_path / "p.json", model, choices)
        with pytest.raises(OsdpFileError, match="buffer_bytes"):
            make_schedule({**plan, "buffer_bytes": plan["buffer_bytes"] - 4}, model)


def test_a_partial_param_space_holds_only_its_tensors_with_the_whole_models_values():
    specs = [TensorSpec("a.W", (3, 4), "he_normal", 3, 4), TensorSpec("a.b", (4,), "zeros", 3, 4),
             TensorSpec("b.W", (4, 2), "glorot_uniform", 4, 2), TensorSpec("b.b", (2,), "zeros", 4, 2)]
    whole, part = ParamSpace(specs), ParamSpace(specs, resident={"b.W", "b.b"})
    whole.init(3)
    part.init(3)
    assert part.data.size == part.grad.size == 10 and part.nbytes == 40 and part.size == whole.size == 26
    assert part.view("b.W").offset == 16 and part.local_offset("b.W") == 0 and not part.holds("a.W")
    np.testing.assert_array_equal(part.param("b.W"), whole.param("b.W"))
    with pytest.raises(KeyError, match="fetched on demand"):
        part.param("a.W")
    with pytest.raises(ValueError, match="only some"):
        part.state_dict()


def test_a_unit_comes_in_one_piece_from_each_server_that_holds_part_of_it():
    # a Conv2D slice of two runs: W rows [10, 20) and b [40, 42); server 1 holds [0, 15), server 2 the rest
    chunks = [Chunk(0, 10, 9), Chunk(10, 15, 10), Chunk(15, 20, 11), Chunk(20, 40, 12), Chunk(40, 42, 13)]
    parts = tuple((("t", c.size),) for c in chunks)
    layout = Layout(chunks=chunks, chunk_parts=parts, chunk_bytes=80, sfb=[], sfb_bsp=False, hybrid_plan={},
                    shards=[], owner=[1, 1, 2, 2, 2], unit_chunks=(((1, 0), (2, 5), (4, 10)),))
    assert layout.unit_pieces(0) == [(1, 0, [1]), (2, 5, [2, 4])]
    # two runs of a unit on one server with another's between could not go as one message
    apart = Layout(chunks=chunks, chunk_parts=parts, chunk_bytes=80, sfb=[], sfb_bsp=False, hybrid_plan={},
                   shards=[], owner=[1, 1, 2, 2, 1], unit_chunks=(((1, 0), (2, 5), (4, 10)),))
    with pytest.raises(ValueError, match="two runs of it apart"):
        apart.unit_pieces(0)


def test_messages_break_at_every_unit_edge():
    assert _cut([(0, 10), (10, 5)], [4, 10, 12]) == [(0, 4), (4, 6), (10, 2), (12, 3)]
    assert _cut([(0, 10)], []) == [(0, 10)]


# -- runs ------------------------------------------------------------------------------------------------

HIDDEN = "model.hidden=[64, 32]"
ORACLE = ["sync.model=bsp", "stop.iterations=30", "optim.momentum=0.9", "straggler.enabled=false", HIDDEN]


@pytest.fixture(scope="module")
def oracle(tmp_path_factory) -> Path:
    """The single-process oracle of ``ORACLE`` with 3 workers, run once for every run it is held against."""
    return oracle_run(tmp_path_factory, "sync.workers=3", *ORACLE)


def digits_plan(tmp_path: Path, choices, overlap: bool, model=(HIDDEN,)) -> Path:
    job = load_job(None, list(model))
    path = tmp_path / "plan.json"
    write_plan(path, build.model(job, build.dataset(job)), choices, overlap)
    return path


def held_bytes(plan: Path) -> int:
    """What a worker under `plan` holds for the whole run, at least: its resident layers' weights and
    gradients (its ``ParamSpace``, float32) and the fetch buffer."""
    job = load_job(None, [HIDDEN])
    whole = build.model(job, build.dataset(job)).space
    doc = json.loads(plan.read_text())
    resident = sum(v.size for v in whole.tensors if v.name not in on_demand_tensors(doc)) * 4
    return 2 * resident + doc["buffer_bytes"]


@pytest.mark.timeout(400)
@pytest.mark.parametrize("choices, overlap, wire", [((2, 1, 0), True, "runtime.wait_free_backprop=true"),
                                                    ((1, 0, 3), False, "runtime.wait_free_backprop=false")],
                         ids=["split-ondemand-resident-wfbp", "ondemand-resident-split-kept"])
def test_bsp_with_on_demand_layers_equals_the_oracle(choices, overlap, wire, oracle, tmp_path):
    plan = digits_plan(tmp_path, choices, overlap)
    p = train(4, tmp_path / "osdp", f"osdp.plan={plan}", wire, "runtime.chunk_bytes=4096", *ORACLE, timeout=180)
    assert p.returncode == 0, p.stderr
    assert max_abs_difference(tmp_path / "osdp", oracle) <= 1e-5

    s = json.loads((tmp_path / "osdp" / "summary.json").read_text())
    assert s["iterations"] == [30, 30, 30]
    measured = s["osdp"]["measured"]
    # the split temporary and the activations of this small MLP come on top of what the worker
    # holds for the whole run, well under 1 MiB
    held = held_bytes(plan)
    for peak in measured["peak_bytes"]:
        assert held <= peak <= held + (1 << 20), (peak, held)
    assert all(t > 0 for t in measured["iteration_s"])
    assert all(m > 0 for m in measured["transfer_messages"])  # fetches and their pushes were counted
    assert all(w > 0 for w in measured["transfer_wait_s"])
    # 4 ranks on one node: they share cores where it has fewer CPUs (the prediction assumes a core each)
    assert s["osdp"]["ranks_share_cores"] is (len(os.sched_getaffinity(0)) < 4)


@pytest.mark.timeout(400)
@pytest.mark.parametrize("choices, stream", [((2, 1, 0), "true"), ((1, 1, 1), "auto")],
                         ids=["split-ondemand-resident-streamed", "all-ondemand"])
def test_bsp_with_on_demand_layers_from_two_servers_equals_the_oracle(choices, stream, oracle, tmp_path):
    """Units that span both shards come in one reply from each server; their gradients go to the owner
    of each chunk. With every layer on demand no pull reply carries a chunk, and with streamed rounds
    every resident chunk may have gone before the round closes: a fetch of the next round must still
    wait until the shard server has closed the round (it read the weights before it)."""
    plan = digits_plan(tmp_path, choices, True)
    p = train(5, tmp_path / "osdp", f"osdp.plan={plan}", "runtime.servers=2", "runtime.chunk_bytes=4096", *ORACLE,
              f"runtime.stream_rounds={stream}", timeout=240)
    assert p.returncode == 0, p.stderr
    assert max_abs_difference(tmp_path / "osdp", oracle) <= 1e-5
    s = json.loads((tmp_path / "osdp" / "summary.json").read_text())
    assert s["iterations"] == [30, 30, 30]
    # both servers answered fetches. Per iteration 6 fetches (2 messages each from one server) and 3
    # pushes (counted 1 each) make 15 messages; a fetch of a unit on both servers adds 2
    assert min(s["bytes"][r]["total"]["fetch"]["sent"] for r in (0, 1)) > 0, s["bytes"]
    assert all(m > 15 for m in s["osdp"]["measured"]["transfer_messages"]), s["osdp"]["measured"]


CNN = ("model.kind=cnn", "model.channels=[4, 8]", "model.hidden=[32]")


@pytest.mark.timeout(400)
def test_bsp_with_conv_layers_in_slices_equals_the_oracle(tmp_path_factory, tmp_path):
    """Each Conv2D slice is two runs of the parameters (its channels' W, then their b): fetched as one
    unit, its gradient pushed as one message per run."""
    overrides = [o for o in ORACLE if o != HIDDEN] + [*CNN, "stop.iterations=20"]
    oracle = oracle_run(tmp_path_factory, "sync.workers=3", *overrides)
    plan = digits_plan(tmp_path, (2, 4, 1, 0), True, model=CNN)
    p = train(4, tmp_path / "osdp", f"osdp.plan={plan}", *overrides, timeout=180)
    assert p.returncode == 0, p.stderr
    assert max_abs_difference(tmp_path / "osdp", oracle) <= 1e-5
    assert json.loads((tmp_path / "osdp" / "summary.json").read_text())["iterations"] == [20, 20, 20]


@pytest.mark.timeout(600)
@pytest.mark.parametrize("model", ["asp", "ssp", "dssp", "elasticbsp", "psp"])
def test_every_sync_model_trains_with_on_demand_layers(model, tmp_path):
    # momentum 0.5, as the other asynchronous runs' tests: at 0.9 stale pushes make the accuracy of a
    # short run depend on the order they arrived in (0.886 seen once; BSP's exactness is the oracle test's)
    plan = digits_plan(tmp_path, (2, 1, 0), True)
    p = train(4, tmp_path / "run", f"osdp.plan={plan}", f"sync.model={model}", "stop.iterations=120", HIDDEN,
              "optim.momentum=0.5", "straggler.slowdown=[1, 1, 2]", "straggler.base_s=0.002", timeout=240)
    assert p.returncode == 0, p.stderr
    s = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert s["iterations"] == [120, 120, 120] and s["rejected_pushes"] == 0
    assert s["test_accuracy"] >= 0.9, s["test_accuracy"]


@pytest.mark.parametrize("overrides, says", [
    ([], "on demand from a parameter server: run it under mpiexec"),
    (["comm.hybrid=sfb"], "set comm.hybrid = 'ps'"),
])
def test_what_on_demand_layers_cannot_run_with_is_one_line_before_training(overrides, says, tmp_path, capsys,
                                                                          monkeypatch):
    plan = digits_plan(tmp_path, (1, 0, 0), False)
    if overrides:  # as under mpiexec with 4 ranks
        monkeypatch.setenv("OMPI_COMM_WORLD_SIZE", "4")
        monkeypatch.setenv("PMI_SIZE", "4")
    args = ["train", "--set", f"osdp.plan={plan}", "--set", HIDDEN, "-q", "--out", str(tmp_path / "run")]
    for o in overrides:
        args += ["--set", o]
    assert says in one_line_error(capsys, args)
    assert not (tmp_path / "run").exists()


@pytest.mark.slow
@pytest.mark.timeout(400)
@pytest.mark.parametrize("wire", ["runtime.cuda_aware_mpi=false", "runtime.cuda_aware_mpi=true"],
                         ids=["staged", "cuda-aware"])
def test_bsp_with_on_demand_layers_on_the_fake_device_equals_the_oracle(wire, oracle, tmp_path):
    """The CuPy path of the fetch buffer (tests/fakecupy.py): staged through a host mirror, or read
    and written by MPI on the device after a synchronize."""
    import fakecupy

    plan = digits_plan(tmp_path, (2, 1, 3), True)
    held = held_bytes(plan)
    predict(plan, held + (1 << 20))  # the pool's bound: 1.15 times that
    p = train(4, tmp_path / "gpu", "backend=cupy", f"osdp.plan={plan}", wire, *ORACLE, timeout=180,
              extra_env=fakecupy.child_env(devices=2))
    assert p.returncode == 0, p.stderr
    assert max_abs_difference(tmp_path / "gpu", oracle) <= 1e-5
    s = json.loads((tmp_path / "gpu" / "summary.json").read_text())
    assert "cupy:" in json.dumps(s)
    # the device memory pool's peak (the fake's counts its arrays): as on NumPy, what the worker holds
    # for the whole run and, well under 1 MiB, its steps' activations and the batches on the device;
    # the memory hook's peak of the arrays alone is no more than the pool's
    measured = s["osdp"]["measured"]
    peaks, lives = measured["peak_bytes"], measured["live_peak_bytes"]
    assert len(peaks) == 3 and all(held <= peak <= held + (1 << 20) for peak in peaks), (peaks, held)
    assert all(held <= live <= peak for live, peak in zip(lives, peaks, strict=True)), (lives, peaks)


def predict(plan: Path, peak_bytes: int) -> None:
    """Write a predicted peak into the plan file (the tests' plans predict nothing)."""
    doc = json.loads(plan.read_text())
    doc["predicted"] = {"peak_bytes": peak_bytes}
    plan.write_text(json.dumps(doc))


def test_pool_bound_is_the_prediction_and_headroom_never_above_the_limit():
    assert pool_bound(None, None) is None
    assert pool_bound(1000, None) == 1150
    assert pool_bound(1000, 1100) == 1100
    assert pool_bound(None, 4096) == 4096


@pytest.mark.slow
@pytest.mark.timeout(200)
def test_on_the_device_arrays_past_the_plans_bound_stop_the_run_in_one_line(tmp_path):
    """A plan that predicts less than the worker's arrays need: the pool's bound stops the run at the
    first allocation past it, in one line naming OSDP and both figures, instead of overrunning."""
    import fakecupy

    plan = digits_plan(tmp_path, (2, 1, 3), True)
    predict(plan, held_bytes(plan) // 2)
    p = train(3, tmp_path / "gpu", "backend=cupy", f"osdp.plan={plan}", *ORACLE, timeout=150,
              extra_env=fakecupy.child_env(devices=1))
    assert p.returncode != 0
    assert "OSDP: this worker's arrays need more device memory than its plan allows" in p.stderr, p.stderr
    assert "Traceback" not in p.stderr


# -- long runs and silent servers ------------------------------------------------------------------------


def test_the_iteration_times_a_worker_keeps_do_not_grow_and_give_the_last_medians():
    """The medians come from the last KEEP iterations, held in arrays made once; while all are kept,
    the first (warm-up) interval is left out, as before."""
    times = IterationTimes(keep=8)
    starts = np.cumsum(np.arange(1.0, 41.0))  # intervals 2, 3, 4, ...
    arrays = (times.starts, times.waited)
    for k, t in enumerate(starts[:5]):
        times.start(t, 0.5 * k)
    assert times.medians() == (float(np.median(np.diff(starts[1:5]))), 0.5)
    for k, t in enumerate(starts[5:], start=5):
        times.start(t, 0.5 * k)
    assert times.medians() == (float(np.median(np.diff(starts[-9:]))), 0.5)
    assert (times.starts, times.waited) == arrays and len(times.starts) == 9


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_a_long_osdp_run_measures_the_peak_of_a_short_one(tmp_path):
    """Nothing a worker holds grows with the run: 3,000 iterations measure the peak of 300 within 2 %
    (a list of every iteration's start, and the trace's h5py objects, grew it by ~100 bytes an
    iteration: 215 KB at 619 iterations, 810 KB at 5,960)."""
    plan = digits_plan(tmp_path, (0, 0, 1), False)
    peaks = {}
    for iterations in (300, 3000):
        out = tmp_path / f"run{iterations}"
        p = train(2, out, f"osdp.plan={plan}", HIDDEN, f"stop.iterations={iterations}", "stop.epochs=0",
                  "straggler.enabled=false", "eval.every_seconds=1000", "trace.flush_seconds=0.2", timeout=500)
        assert p.returncode == 0, p.stderr
        s = json.loads((out / "summary.json").read_text())
        assert s["iterations"] == [iterations]
        peaks[iterations] = s["osdp"]["measured"]["peak_bytes"][0]
    print(f"measured peak: {peaks}")  # shown with pytest -s
    assert abs(peaks[3000] - peaks[300]) <= 0.02 * peaks[300], peaks


@pytest.mark.skipif(not Path("/proc").is_dir(), reason="finds the rank's process through /proc")
@pytest.mark.timeout(300)
def test_a_stopped_shard_server_is_named_by_workers_waiting_on_its_fetches(tmp_path):
    """With 2 servers the output layer lies on server 1, and every worker fetches it each iteration.
    SIGSTOP of server 1 leaves the workers waiting on its fetch replies (or its part of a pull): they
    name server 1, never rank 0 (the fetch's wait had the pull's message, 'the server (rank 0)')."""
    plan = digits_plan(tmp_path, (0, 0, 1), False)
    ended = signal_rank_mid_run(tmp_path, 1, signal.SIGSTOP, 4.0, f"osdp.plan={plan}", HIDDEN,
                                "runtime.servers=2", "straggler.base_s=0.002", ranks=5)
    assert ended.code != 0
    assert "the server (rank 0) sent nothing" not in ended.output, ended.output[-3000:]
    assert "the server 1 (rank 1) sent nothing" in ended.output or "server rank 1 silent" in ended.output, \
        ended.output[-3000:]
