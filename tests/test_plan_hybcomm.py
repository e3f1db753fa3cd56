"""HybComm's byte-cost model: Poseidon's Table 1, this topology's counts by hand, the choice, errors."""

from __future__ import annotations

import json
import math

import pytest

from ebsp_mpi.plan import (
    SFB_OVERHEAD_BYTES, Cost, HybCommPlan, choose, crossover_batch, crossover_batch_timed, crossover_workers,
    poseidon_ps_bytes, poseidon_sfb_bytes, ps_bytes, sfb_bytes, sfb_overhead,
)

MB = 1e6  # Poseidon's Table 1 counts MB as 10**6 bytes
FC6 = (25088, 4096)  # VGG19
FC7 = (4096, 4096)


def mb(x: float) -> float:
    return round(x / MB, 1)


# --- Poseidon's Table 1 (colocated servers) --------------------------------------------------------

def test_table1_fc6_at_8_nodes():
    assert mb(poseidon_ps_bytes(*FC6, p=8).busiest) == 1438.6
    assert mb(poseidon_sfb_bytes(*FC6, k=32, p=8).busiest) == 52.3


def test_table1_fc7_at_4_nodes():
    assert mb(poseidon_ps_bytes(*FC7, p=4).busiest) == 201.3
    assert mb(poseidon_sfb_bytes(*FC7, k=32, p=4).busiest) == 6.3


def test_colocated_node_moves_both_roles():
    # a colocated node is a worker and a server: its bytes are the sum, each role half of 4·MN·(P−1)/P
    c = poseidon_ps_bytes(3, 5, p=4)
    assert c.colocated
    assert c.worker == c.server == 4 * 2 * 15 * 3 / 4
    assert c.busiest == c.worker + c.server
    assert poseidon_sfb_bytes(3, 5, k=2, p=4) == Cost(worker=4 * 2 * 2 * 8 * 3, server=0.0, colocated=True)


def test_crossover_nodes_of_fc6():
    assert round(crossover_workers(*FC6, k=32), 1) == 220.1


def test_colocated_crossover_found_by_the_model_is_p_star():
    # SFB moves fewer bytes below P* = 220.07, PS from the first whole P above it
    p_star = crossover_workers(*FC6, k=32)
    sfb_wins = [p for p in range(2, 400)
                if poseidon_sfb_bytes(*FC6, k=32, p=p).busiest < poseidon_ps_bytes(*FC6, p=p).busiest]
    assert sfb_wins == list(range(2, math.ceil(p_star)))


# --- this project's topology, counted by hand (M = 3, N = 5, K = 2, P1 = 4) -------------------------
# MN = 15 floats, the factors K·(M+N) = 16 floats, × 4 bytes each

@pytest.mark.parametrize("servers, server_bytes", [(1, 480.0), (2, 240.0)])
def test_ps_counts(servers, server_bytes):
    # worker: push 15 + pull 15 floats; servers: 4 pushes in, 4 pulls out, 2·4·15 = 120 floats in all
    assert ps_bytes(3, 5, workers=4, servers=servers) == Cost(worker=120.0, server=server_bytes)


@pytest.mark.parametrize("servers, server_bytes", [(1, 256.0), (2, 128.0)])
def test_sfb_bsp_counts(servers, server_bytes):
    # worker: 4 copies of 16 out (3 workers + the server), 3 sets in = 7·16 floats; server: 4·16 in
    assert sfb_bytes(3, 5, k=2, workers=4, servers=servers, synchronous=True) == Cost(448.0, server_bytes)


@pytest.mark.parametrize("servers, server_bytes", [(1, 496.0), (2, 248.0)])
def test_sfb_async_counts(servers, server_bytes):
    # worker: push 16 factor floats, pull 15 dense; servers: 4·16 in, 4·15 out = 124 floats in all
    assert sfb_bytes(3, 5, k=2, workers=4, servers=servers, synchronous=False) == Cost(124.0, server_bytes)


def test_busiest_is_the_larger_role_on_dedicated_servers():
    assert Cost(worker=120.0, server=480.0).busiest == 480.0
    assert Cost(worker=448.0, server=256.0).busiest == 448.0


# --- the choice --------------------------------------------------------------------------------------

@pytest.mark.parametrize("synchronous", [True, False])
def test_auto_picks_sfb_for_a_large_dense_layer(synchronous):
    plan = choose([("fc7.W", *FC7, True)], batch=32, workers=4, servers=1, synchronous=synchronous)
    assert plan.scheme("fc7.W") == "sfb"
    layer = plan.layers[0]
    assert layer.sfb.busiest < layer.ps.busiest
    assert layer.cost == layer.sfb


@pytest.mark.parametrize("synchronous", [True, False])
def test_auto_picks_ps_where_ps_moves_less(synchronous):
    # 64×10 = 640 floats of gradient against 32·74 = 2368 floats of factors per worker
    plan = choose([("out.W", 64, 10, True)], batch=32, workers=4, servers=1, synchronous=synchronous)
    assert plan.scheme("out.W") == "ps"
    assert plan.layers[0].ps.busiest < plan.layers[0].sfb.busiest


def test_auto_tie_keeps_ps():
    # asynchronous: K·(M+N) = 32·128 = 4096 = MN, so both schemes move the same bytes
    layer = [("w", 64, 64, True)]
    tie = choose(layer, batch=32, workers=4, servers=1, synchronous=False).layers[0]
    assert tie.ps.busiest == tie.sfb.busiest and tie.scheme == "ps"
    assert choose(layer, batch=31, workers=4, servers=1, synchronous=False).scheme("w") == "sfb"


MODEL = [("conv1.W", 16, 27, False), ("conv1.b", 1, 16, False), ("fc1.W", 4096, 4096, True),
         ("fc1.b", 1, 4096, False), ("out.W", 64, 10, True), ("out.b", 1, 10, False)]


def test_modes_over_a_model():
    auto = choose(MODEL, batch=32, workers=4)
    assert auto.schemes == {"conv1.W": "ps", "conv1.b": "ps", "fc1.W": "sfb", "fc1.b": "ps", "out.W": "ps",
                            "out.b": "ps"}
    sfb = choose(MODEL, batch=32, workers=4, mode="sfb")
    assert sfb.sfb_layers == ("fc1.W", "out.W")  # every dense weight, never a bias or a conv kernel
    assert choose(MODEL, batch=32, workers=4, mode="ps").sfb_layers == ()


def test_costs_under_both_schemes_whatever_the_mode():
    for mode in ("ps", "sfb", "auto"):
        by_name = {c.name: c for c in choose(MODEL, batch=32, workers=4, mode=mode).layers}
        assert by_name["fc1.W"].ps == ps_bytes(4096, 4096, 4, 1)
        assert by_name["fc1.W"].sfb == sfb_bytes(4096, 4096, 32, 4, 1, synchronous=True)
        assert by_name["conv1.W"].sfb is None  # SFB does not apply to a conv kernel


def test_total_adds_the_chosen_costs():
    plan = choose(MODEL, batch=32, workers=4)
    worker = sum(c.sfb.worker if c.scheme == "sfb" else c.ps.worker for c in plan.layers)
    server = sum(c.sfb.server if c.scheme == "sfb" else c.ps.server for c in plan.layers)
    assert plan.total() == Cost(worker, server)


def test_plan_as_dict_is_json():
    plan = choose(MODEL, batch=32, workers=4, servers=2, synchronous=False)
    d = json.loads(json.dumps(plan.as_dict()))
    assert (d["mode"], d["batch"], d["workers"], d["servers"], d["synchronous"]) == ("auto", 32, 4, 2, False)
    assert list(d["layers"]) == [name for name, *_ in MODEL]
    assert d["layers"]["fc1.W"]["scheme"] == "sfb"
    assert d["layers"]["fc1.W"]["sfb"] == sfb_bytes(4096, 4096, 32, 4, 2, synchronous=False).as_dict()
    assert d["layers"]["conv1.b"]["sfb"] is None
    assert d["total"]["busiest"] == plan.total().busiest


# --- the crossover on this topology --------------------------------------------------------------------

@pytest.mark.parametrize("m, n, workers, servers, synchronous", [
    (100, 50, 4, 1, True),    # K* = 2·5000·4 / (7·150) = 38.1
    (100, 50, 3, 4, True),    # more servers than workers: K* = 2·5000 / (5·150) = 13.3
    (30, 20, 2, 1, True),     # K* = 2·600·2 / (3·50) = 16 exactly: a tie, PS
    (100, 50, 4, 1, False),   # K* = 5000 / 150 = 33.3
    (64, 64, 4, 2, False),    # K* = 4096 / 128 = 32 exactly: a tie, PS
])
def test_crossover_batch_found_by_the_model(m, n, workers, servers, synchronous):
    k_star = crossover_batch(m, n, workers, servers, synchronous)
    if synchronous:
        assert k_star == pytest.approx(2 * m * n * max(1, workers / servers) / ((2 * workers - 1) * (m + n)))
    else:
        assert k_star == m * n / (m + n)
    sfb_batches = [k for k in range(1, 200)
                   if choose([("w", m, n, True)], k, workers, servers, synchronous).scheme("w") == "sfb"]
    assert sfb_batches == list(range(1, math.ceil(k_star)))


# --- SFB's fixed cost per layer (the timed model) -------------------------------------------------------

def square(d: int, k: int, workers: int) -> str:
    """auto's scheme, with the measured default fixed cost, for a d × d layer at batch k under BSP."""
    return choose([("w", d, d, True)], k, workers, 1, True, sfb_overhead_bytes=SFB_OVERHEAD_BYTES).scheme("w")


@pytest.mark.parametrize("workers", [2, 3, 4])
def test_auto_keeps_ps_at_128_wide_where_sfb_was_measured_slower(workers):
    # bytes alone pick SFB here (K* = 73 - 85 > 32); measured across nodes at 1 Gbit/s SFB took
    # longer than PS with 2, 3 and 4 workers
    assert choose([("w", 128, 128, True)], 32, workers, 1, True).scheme("w") == "sfb"
    assert square(128, 32, workers) == "ps"


@pytest.mark.parametrize("d", [256, 512, 1024, 2048, 4096])
@pytest.mark.parametrize("workers", [2, 3, 4])
def test_auto_takes_sfb_from_256_wide(d, workers):
    assert square(d, 32, workers) == "sfb"


@pytest.mark.parametrize("workers", [2, 3, 4])
def test_auto_keeps_the_byte_models_choice_for_the_default_bench_shapes(workers):
    assert square(4096, 8, workers) == "sfb"
    narrow = choose([("w", 16, 256, True)], 64, workers, 1, True, sfb_overhead_bytes=SFB_OVERHEAD_BYTES)
    assert narrow.scheme("w") == "ps"  # 256 x 16 at K = 64 (IN x OUT; M x N = 16 x 256)


DIGITS = [("dense1.W", 128, 64, True), ("dense1.b", 1, 128, False), ("dense2.W", 64, 128, True),
          ("dense2.b", 1, 64, False), ("dense3.W", 10, 64, True), ("dense3.b", 1, 10, False)]
WIDE = [("dense1.W", 4096, 4096, True), ("dense1.b", 1, 4096, False), ("dense2.W", 10, 4096, True),
        ("dense2.b", 1, 10, False)]


@pytest.mark.parametrize("workers", [2, 3, 4])
def test_auto_over_two_models(workers):
    # the digits MLP 64-128-64-10: every layer through the servers (bytes alone put dense1.W and
    # dense2.W on SFB); the wide MLP 4096-4096-10: its 4096 x 4096 layer by factors, the head by PS
    digits = choose(DIGITS, 32, workers, sfb_overhead_bytes=SFB_OVERHEAD_BYTES)
    assert digits.sfb_layers == ()
    assert choose(DIGITS, 32, workers).sfb_layers == ("dense1.W", "dense2.W")
    assert choose(WIDE, 32, workers, sfb_overhead_bytes=SFB_OVERHEAD_BYTES).sfb_layers == ("dense1.W",)


def test_the_fixed_cost_by_hand():
    # BSP: c on the worker, c / P2 on the server (one rebuild a round); async: c·P1 / P2 (one per push)
    assert sfb_overhead(4, 2, True, 1000.0) == Cost(worker=1000.0, server=500.0)
    assert sfb_overhead(4, 2, False, 1000.0) == Cost(worker=1000.0, server=2000.0)
    layer = choose([("w", 128, 128, True)], 32, 2, sfb_overhead_bytes=1000.0).layers[0]
    assert layer.sfb == sfb_bytes(128, 128, 32, 2)  # the bytes stay the bytes: the cost is beside them
    assert layer.sfb_overhead == Cost(1000.0, 1000.0)
    assert choose([("w", 128, 128, True)], 32, 2).as_dict()["sfb_overhead_bytes"] == 0.0


@pytest.mark.parametrize("m, n, workers, servers, synchronous, c", [
    (128, 128, 2, 1, True, SFB_OVERHEAD_BYTES),   # K*_c = 85.3 - 737280 / (4·3·256) = 85.3 - 240 < 1: never
    (512, 512, 4, 1, True, SFB_OVERHEAD_BYTES),   # 292.6 - 737280 / (4·7·1024) = 266.9
    (256, 256, 3, 2, True, 100_000.0),            # more servers than one: 2·65536·1.5/(5·512) - 100000/(4·5·512)
    (300, 200, 4, 1, False, 50_000.0),            # async: 120 - 50000 / 2000 = 95
    (64, 64, 2, 1, True, 0.0),                    # c = 0: the byte model's K* = 42.7
])
def test_crossover_batch_timed_found_by_choose(m, n, workers, servers, synchronous, c):
    k_star = crossover_batch_timed(m, n, workers, servers, synchronous, c)
    copies = (2 * workers - 1) if synchronous else 1
    assert k_star == pytest.approx(max(0.0, crossover_batch(m, n, workers, servers, synchronous)
                                        - c / (4 * copies * (m + n))))
    sfb_batches = [k for k in range(1, 400) if choose([("w", m, n, True)], k, workers, servers, synchronous,
                                                      sfb_overhead_bytes=c).scheme("w") == "sfb"]
    assert sfb_batches == list(range(1, math.ceil(k_star)))


def test_crossover_batch_timed_without_cost_is_the_byte_models():
    assert crossover_batch_timed(100, 50, 4, 1, True, 0.0) == crossover_batch(100, 50, 4, 1, True)


@pytest.mark.parametrize("bad", [-1.0, float("inf"), float("nan"), True, "1e5"])
def test_bad_overhead(bad):
    with pytest.raises(ValueError, match=r"comm.sfb_overhead_bytes = .*: must be a finite number >= 0"):
        choose(MODEL, batch=32, workers=4, sfb_overhead_bytes=bad)


# --- errors ------------------------------------------------------------------------------------------

def test_sfb_needs_a_dense_layer():
    convs = [("conv1.W", 16, 27, False), ("conv1.b", 1, 16, False)]
    with pytest.raises(ValueError) as e:
        choose(convs, batch=32, workers=4, mode="sfb")
    assert str(e.value) == "comm.hybrid = 'sfb' needs a dense layer; this model has none"
    assert choose(convs, batch=32, workers=4, mode="auto").sfb_layers == ()  # auto is fine without one


def test_unknown_mode():
    with pytest.raises(ValueError, match=r"comm.hybrid = 'dense' is not one of 'ps', 'sfb', 'auto'"):
        choose(MODEL, batch=32, workers=4, mode="dense")


@pytest.mark.parametrize("kwargs, names", [
    (dict(batch=0, workers=4, servers=1), "batch"),
    (dict(batch=32, workers=0, servers=1), "workers"),
    (dict(batch=32, workers=4, servers=0), "servers"),
    (dict(batch=2.5, workers=4, servers=1), "batch"),
    (dict(batch=True, workers=4, servers=1), "batch"),
])
def test_bad_counts(kwargs, names):
    with pytest.raises(ValueError, match=names):
        choose(MODEL, **kwargs)


@pytest.mark.parametrize("layer, says", [
    (("w", 0, 5, True), "layer 'w': M"),
    (("w", 3, -1, True), "layer 'w': N"),
    (("w", 3, 5), r"\(name, M, N, is_dense\)"),
    (("", 3, 5, True), "name"),
    (("w", 3, 5, "yes"), "is_dense"),
])
def test_bad_layers(layer, says):
    with pytest.raises(ValueError, match=says):
        choose([layer], batch=32, workers=4)


def test_duplicate_names():
    with pytest.raises(ValueError, match=r"more than once: fc1\.W"):
        choose([("fc1.W", 4, 4, True), ("fc1.W", 4, 4, True)], batch=32, workers=4)


def test_cost_functions_check_their_arguments():
    with pytest.raises(ValueError, match="P"):
        poseidon_ps_bytes(3, 5, p=0)
    with pytest.raises(ValueError, match="K"):
        sfb_bytes(3, 5, k=0, workers=4)
    with pytest.raises(KeyError, match="no tensor 'x'"):
        choose(MODEL, batch=32, workers=4).scheme("x")
    assert isinstance(choose(MODEL, batch=32, workers=4), HybCommPlan)
