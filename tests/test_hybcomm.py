"""Poseidon's hybrid communication end to end (``comm.hybrid``): BSP with sufficient factors against the
oracle, the byte counters against the cost model's formulas, every sync model training with SFB, and
the one-line errors."""

import json

import numpy as np
import pytest

from ebsp_mpi import build
from ebsp_mpi.config import load_job
from ebsp_mpi.errors import UsageError
from ebsp_mpi.nn import Conv2D, Flatten, Model, ReLU
from ebsp_mpi.outputs import read_model
from ebsp_mpi.plan.hybcomm import sfb_bytes
from mpirun import local, train

pytestmark = [pytest.mark.timeout(600), pytest.mark.slow]

ORACLE = ["sync.model=bsp", "stop.iterations=40", "optim.momentum=0.9", "optim.weight_decay=5e-4",
          "straggler.enabled=false"]
K, ITERATIONS = 32, 10
# the digits MLP's tensors: (name, d_in, d_out) of each weight, and the bias sizes
DENSE = {"dense1.W": (64, 128), "dense2.W": (128, 10)}
BIAS = {"dense1.b": 128, "dense2.b": 10}


def summary(run_dir) -> dict:
    return json.loads((run_dir / "summary.json").read_text())


def test_bsp_with_sufficient_factors_equals_the_single_process_oracle(tmp_path):
    p = train(4, tmp_path / "mpi", "comm.hybrid=sfb", *ORACLE)
    assert p.returncode == 0, p.stderr
    q = local(tmp_path / "oracle", "sync.workers=3", *ORACLE)
    assert q.returncode == 0, q.stderr
    a, attrs_a = read_model(tmp_path / "mpi" / "model.h5")
    b, attrs_b = read_model(tmp_path / "oracle" / "model.h5")
    assert attrs_a["version"] == attrs_b["version"] == 40
    assert max(float(np.abs(a[k] - b[k]).max()) for k in a) <= 1e-5
    assert summary(tmp_path / "mpi")["hybrid"]["layers"]["dense1.W"]["scheme"] == "sfb"


def _expected(model: str, hybrid: str, workers: int) -> tuple[dict, dict]:
    """Per tensor and scheme, the (sent, received) payload bytes of a worker and of the server over a
    run of ITERATIONS pushes per worker: one pull of the initial weights, one after every push (the
    last one with the stop reply); under BSP with SFB the replies after the first leave the SFB layers
    out, and each worker's factors go to the other workers and the server."""
    n, f = workers, 4
    worker, server = {}, {}
    for name, size in BIAS.items():
        worker[name, "ps"] = (ITERATIONS * size * f, (ITERATIONS + 1) * size * f)
        server[name, "ps"] = (n * (ITERATIONS + 1) * size * f, n * ITERATIONS * size * f)
    for name, (d_in, d_out) in DENSE.items():
        size, factors = d_in * d_out * f, K * (d_in + d_out) * f
        if hybrid == "ps":
            worker[name, "ps"] = (ITERATIONS * size, (ITERATIONS + 1) * size)
            server[name, "ps"] = (n * (ITERATIONS + 1) * size, n * ITERATIONS * size)
        elif model == "bsp":
            worker[name, "ps"], server[name, "ps"] = (0, size), (n * size, 0)
            worker[name, "sfb"] = (ITERATIONS * factors * n, ITERATIONS * factors * (n - 1))
            server[name, "sfb"] = (0, n * ITERATIONS * factors)
        else:
            worker[name, "ps"] = (0, (ITERATIONS + 1) * size)
            server[name, "ps"] = (n * (ITERATIONS + 1) * size, 0)
            worker[name, "sfb"] = (ITERATIONS * factors, 0)
            server[name, "sfb"] = (0, n * ITERATIONS * factors)
    return worker, server


def _counted(counts: dict) -> dict:
    return {(tensor, scheme): (c["sent"], c["received"])
            for tensor, schemes in counts.items() if tensor != "total" for scheme, c in schemes.items()}


@pytest.mark.parametrize("model, hybrid", [("bsp", "ps"), ("bsp", "sfb"), ("asp", "sfb")])
def test_the_byte_counters_equal_the_formulas(model, hybrid, tmp_path):
    p = train(3, tmp_path, f"sync.model={model}", f"comm.hybrid={hybrid}", f"stop.iterations={ITERATIONS}",
              f"data.batch_size={K}", "straggler.enabled=false")
    assert p.returncode == 0, p.stderr
    s = summary(tmp_path)
    worker, server = _expected(model, hybrid, workers=2)
    assert _counted(s["bytes"][0]) == {k: v for k, v in server.items() if v != (0, 0)}
    for rank in (1, 2):
        assert _counted(s["bytes"][rank]) == {k: v for k, v in worker.items() if v != (0, 0)}
    if hybrid == "sfb":  # per iteration, less the first pull, the worker moves what the cost model says
        d_in, d_out = DENSE["dense1.W"]
        sent, received = worker["dense1.W", "sfb"]
        predicted = sfb_bytes(d_out, d_in, K, workers=2, synchronous=model == "bsp").worker
        dense_pull = 0 if model == "bsp" else d_in * d_out * 4 * ITERATIONS
        assert (sent + received + dense_pull) / ITERATIONS == predicted


@pytest.mark.parametrize("hybrid", ["sfb", "auto"])
@pytest.mark.parametrize("model", ["bsp", "asp", "ssp", "dssp", "elasticbsp"])
def test_every_sync_model_trains_the_digits_mlp_with_hybrid_communication(model, hybrid, tmp_path):
    # auto by bytes alone, which puts dense1.W on SFB: the measured fixed cost would send this small
    # model's layers through the server, and the factors' path would go untested
    bytes_alone = ["comm.sfb_overhead_bytes=0"] if hybrid == "auto" else []
    p = train(4, tmp_path, f"sync.model={model}", f"comm.hybrid={hybrid}", "optim.momentum=0.5", *bytes_alone)
    assert p.returncode == 0, p.stderr
    s = summary(tmp_path)
    assert s["test_accuracy"] >= 0.95
    assert s["bytes"][1]["total"].get("sfb", {}).get("sent", 0) > 0  # factors did travel


def test_a_misspelt_comm_hybrid_is_one_line_and_exit_2(tmp_path):
    p = local(tmp_path, "comm.hybrid=sfd")
    assert p.returncode == 2 and "comm.hybrid = 'sfd': must be one of ps, sfb, auto" in p.stderr


def test_sfb_on_a_model_with_no_dense_layer_is_refused_in_one_line():
    job = load_job(None, ["comm.hybrid=sfb"])
    model = Model([Conv2D(10, 3), ReLU(), Flatten()], (1, 3, 3), 10)
    with pytest.raises(UsageError, match=r"comm\.hybrid = 'sfb': .*needs a dense layer; this model has none"):
        build.hybrid_plan(job, model, 2)
    assert build.hybrid_plan(load_job(None, ["comm.hybrid=auto"]), model, 2)[0] == set()  # auto: all PS


def test_auto_plans_for_the_servers_the_job_has():
    """comm.hybrid = auto prices a layer's traffic at the busiest server: with runtime.servers = 2 each
    server carries half of the PS traffic, and under BSP the digits MLP's dense1.W then goes through
    the servers, where one server would take it as sufficient factors (by bytes alone)."""
    chosen = {}
    for servers in (1, 2):
        job = load_job(None, ["comm.hybrid=auto", "sync.model=bsp", f"runtime.servers={servers}",
                              "comm.sfb_overhead_bytes=0"])
        names, plan = build.hybrid_plan(job, build.model(job, build.dataset(job)), 3)
        assert plan["servers"] == servers
        chosen[servers] = names
    assert "dense1.W" in chosen[1] and "dense1.W" not in chosen[2]


def test_auto_weighs_sfbs_fixed_cost_from_the_job():
    """The job's comm.sfb_overhead_bytes reaches the plan: by default (measured at 1 Gbit/s) the digits
    MLP's small layers all go through the server under BSP with 3 workers; at 0, bytes alone put
    dense1.W on SFB."""
    from ebsp_mpi.plan import SFB_OVERHEAD_BYTES

    plans = {}
    for extra in ([], ["comm.sfb_overhead_bytes=0"]):
        job = load_job(None, ["comm.hybrid=auto", "sync.model=bsp", *extra])
        plans[bool(extra)] = build.hybrid_plan(job, build.model(job, build.dataset(job)), 3)
    names, plan = plans[False]
    assert names == set() and plan["sfb_overhead_bytes"] == SFB_OVERHEAD_BYTES
    names, plan = plans[True]
    assert "dense1.W" in names and plan["sfb_overhead_bytes"] == 0.0
