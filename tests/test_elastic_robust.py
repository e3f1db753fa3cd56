"""ElasticBSP with robust ZipLine: errors learned at each barrier, z = 0 unchanged, z > 0 and "auto"."""

from __future__ import annotations

import numpy as np
import pytest
from test_elastic import simulate

from ebsp_mpi.config import SyncConfig
from ebsp_mpi.sync.elastic import ElasticBSP
from ebsp_mpi.sync.registry import make_policy


def jittered(n: int, seed: int):
    """Iteration times of n workers, speeds over 3x, log-normal jitter (σ = 0.3), fixed per (w, k)."""
    rng = np.random.default_rng(seed)
    speed = np.exp(rng.uniform(0, np.log(3), n))
    noise = np.exp(rng.normal(0, 0.3, (n, 1000)))
    return lambda w, k, t: float(speed[w] * noise[w, k])


def test_each_barrier_teaches_the_error_of_every_push_since_its_decision():
    policy = ElasticBSP(4, lookahead=6)
    run = simulate(policy, jittered(4, 1), iterations=40)
    first = [m for m in run.records["barrier_members"] if m["barrier"] == 0]
    assert all(m["sigma"] == 0.0 for m in first)  # nothing seen before the first barrier
    assert run.records["barriers"][0]["z"] == 0.0
    # after the run: every member saw k = 1..r at its barriers, so σ is learned at those k
    _, c = policy.errors.state()
    for m in run.records["barrier_members"]:
        assert c[m["worker"], : m["r"]].min() >= 1
    assert any(m["sigma"] > 0 for m in run.records["barrier_members"] if m["barrier"] >= 1)
    assert all(b["predicted_interval_spread"] == b["predicted_spread"] for b in run.records["barriers"])


def test_the_first_barrier_learns_exactly_its_members_errors():
    policy = ElasticBSP(3, lookahead=4)
    compute = jittered(3, 2)
    run = simulate(policy, lambda w, k, t: compute(w, k, t), iterations=12)
    members = [m for m in run.records["barrier_members"] if m["barrier"] == 0]
    fresh = ElasticBSP(3, lookahead=4)
    # replay the pushes up to the first release into a fresh policy and read its model right then
    released = run.records["barriers"][0]["t_released"]
    fresh.start(0.0)
    for t, w, _ in run.pushes:
        if t > released:
            break
        fresh.on_push(w, t)
    E, c = fresh.errors.state()
    for m in members:
        assert c[m["worker"], m["r"] - 1] == 1
        assert E[m["worker"], m["r"] - 1] == pytest.approx((m["arrival_t"] - m["predicted_t"]) ** 2)


def test_z_zero_is_the_papers_elasticbsp():
    a = simulate(ElasticBSP(5, lookahead=8), jittered(5, 3), iterations=60)
    b = simulate(ElasticBSP(5, lookahead=8, zipline_z=0.0), jittered(5, 3), iterations=60)
    assert a.pushes == b.pushes and a.releases == b.releases
    assert a.records["barrier_members"] == b.records["barrier_members"]


def test_positive_z_widens_the_intervals_once_errors_are_seen():
    policy = ElasticBSP(5, lookahead=8, zipline_z=2.0)
    run = simulate(policy, jittered(5, 3), iterations=60)
    barriers = run.records["barriers"]
    assert barriers[0]["predicted_interval_spread"] == barriers[0]["predicted_spread"]  # σ = 0 still
    later = barriers[1:]
    assert all(b["z"] == 2.0 for b in barriers)
    assert all(b["predicted_interval_spread"] >= b["predicted_spread"] for b in later)
    assert any(b["predicted_interval_spread"] > b["predicted_spread"] + 4 * b["sigma_mean"] - 1e-12
               for b in later if b["sigma_mean"] > 0)
    paper = simulate(ElasticBSP(5, lookahead=8), jittered(5, 3), iterations=60)
    assert paper.records["barrier_members"] != run.records["barrier_members"]


def test_auto_z_moves_up_its_grid_from_zero():
    policy = ElasticBSP(6, lookahead=8, zipline_z="auto")
    assert policy.z == 0.0
    run = simulate(policy, jittered(6, 4), iterations=200)
    zs = [b["z"] for b in run.records["barriers"]]
    assert zs[0] == 0.0 and len(set(zs)) >= 2
    assert zs == sorted(zs)  # one way: up
    assert [z for _, z in policy._auto.changes] == sorted(set(zs) - {0.0})


@pytest.mark.parametrize("bad", [-1.0, float("nan"), "sometimes"])
def test_bad_z_is_rejected(bad):
    with pytest.raises(ValueError, match="zipline_z"):
        ElasticBSP(2, zipline_z=bad)


def test_registry_passes_zipline_z():
    assert make_policy(SyncConfig(model="elasticbsp", zipline_z=1.5), 3).z == 1.5
    assert make_policy(SyncConfig(model="elasticbsp", zipline_z="auto"), 3)._auto is not None


def test_bad_overdue_is_rejected_and_the_registry_passes_it():
    with pytest.raises(ValueError, match="overdue"):
        ElasticBSP(2, overdue="shift")
    assert make_policy(SyncConfig(model="elasticbsp"), 3).overdue == "none"
    assert make_policy(SyncConfig(model="elasticbsp", overdue="widen"), 3).overdue == "widen"
