"""Re-planned barriers (``sync.replan = "overdue"``): the pure parts, then ElasticBSP on a scripted
late push and in a small simulation where the bound on pushes past a decision must still hold."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from test_elastic import before_first_leave, pushes, simulate, tables

from ebsp_mpi.analysis.runs import model_label
from ebsp_mpi.config import ConfigError, SyncConfig, load_job
from ebsp_mpi.sync.elastic import ElasticBSP
from ebsp_mpi.sync.predictor import PushPredictor
from ebsp_mpi.sync.registry import make_policy
from ebsp_mpi.sync.replan import (REPLAN, barrier_turned_wrong, late_pace, projected_arrival, replan_lookahead,
                                  replan_matrix, worth_replanning)

# -- the pure parts --------------------------------------------------------------------------------


def test_a_late_member_goes_on_at_the_slower_of_its_predicted_and_latest_interval():
    assert late_pace(0.03, 0.18) == 0.18   # it entered a slow phase: the EMA lags behind
    assert late_pace(0.05, 0.02) == 0.05   # a fast iteration does not make the plan tighter
    assert projected_arrival(2.0, 3, 0.18) == pytest.approx(2.54)


def test_a_barrier_turned_wrong_when_the_first_arrival_would_wait_past_the_promise():
    assert barrier_turned_wrong(first_arrival=1.0, projected=1.3, promised_spread=0.2)
    assert not barrier_turned_wrong(first_arrival=1.0, projected=1.2, promised_spread=0.2)


def test_the_replan_has_what_every_member_has_left_of_R():
    assert replan_lookahead(15, np.array([3, 1, 4])) == 11
    assert replan_lookahead(15, np.array([15, 0])) == 0  # a member is at R: the barrier cannot move
    assert replan_lookahead(5, np.array([], dtype=np.int64)) == 0


def test_replan_matrix_starts_held_and_late_members_at_the_replan():
    M = np.array([[5.0, 6.0, 7.0], [5.5, 6.5, 7.5], [4.0, 4.5, 5.0]])
    out = replan_matrix(M, t=4.2, held=np.array([0]), held_rate=np.array([1.0]), late=2, late_rate=0.8)
    np.testing.assert_allclose(out, [[5.2, 6.2, 7.2], [5.5, 6.5, 7.5], [5.0, 5.8, 6.6]])
    assert M[0, 0] == 5.0  # the caller's predictions are left as they were


def test_the_new_plan_is_taken_only_when_it_promises_less_waiting():
    assert worth_replanning(projected=3.0, t=2.0, new_promised_spread=0.3)
    assert not worth_replanning(projected=2.2, t=2.0, new_promised_spread=0.3)


def test_a_restarted_worker_measures_its_next_interval_from_its_release():
    p = PushPredictor(1, rule="ema", ema_alpha=0.5)
    for t in (0.0, 1.0, 2.0):
        p.observe(0, t)
    p.restart(0, 5.0)     # held from 2.0 to 5.0
    p.observe(0, 6.0)
    assert p.latest_interval(0) == 1.0 and p.interval(0) == 1.0


# -- scripted: workers 0 and 1 arrive, worker 2 pushes late before its barrier -----------------------
#
# intervals 1, 1, 0.5. Monitoring ends at 2.2 (worker 1's second push). Predictions (R = 4):
#   worker 0: 3, 4, 5, 6     worker 1: 3.2, 4.2, 5.2, 6.2     worker 2: 2.6, 3.1, 3.6, 4.1
# least spread {3, 3.2, 3.1} (0.2): r = (1, 1, 2). Workers 0 and 1 arrive at 3.0 and 3.2 and are held;
# worker 2 then takes 1.4 s for its next iteration and pushes at 3.5, one push before its barrier: it
# would arrive at 4.9, and worker 0 would wait 1.9 s against the 0.2 promised. Re-planned over R' = 3
# from 3.5: workers 0, 1 at 4.5, 5.5, 6.5 (released now), worker 2 at 4.9, 6.3, 7.7 (its new pace);
# least spread {6.5, 6.5, 6.3} (0.2 < 1.4 still to wait): r' = (3, 3, 2).
MONITOR = [(0, 1.0), (1, 1.2), (2, 1.6), (0, 2.0), (2, 2.1), (1, 2.2)]
HELD = [(0, 3.0), (1, 3.2)]
LATE = (2, 3.5)


def test_a_late_push_moves_the_barrier_and_releases_the_held():
    policy = ElasticBSP(3, lookahead=4, replan="overdue")
    pushes(policy, MONITOR)
    assert policy.targets == {0: 3, 1: 3, 2: 4}
    assert pushes(policy, HELD) == [(), ()] and policy.held == {0, 1}
    assert pushes(policy, [LATE]) == [(0, 1, 2)]
    assert policy.held == set() and policy.replans == 1 and policy.barriers == 0
    # done at the re-plan: 3, 3, 3; plus r' = 3, 3, 2
    assert policy.targets == {0: 6, 1: 6, 2: 5}
    assert policy._barrier.predicted_t == pytest.approx({0: 6.5, 1: 6.5, 2: 6.3})


def test_without_the_rule_the_held_wait_for_the_late_worker():
    policy = ElasticBSP(3, lookahead=4)
    pushes(policy, MONITOR + HELD)
    assert pushes(policy, [LATE]) == [(2,)] and policy.held == {0, 1}
    assert policy.targets == {0: 3, 1: 3, 2: 4}


def test_the_moved_barrier_keeps_its_decision_and_counts_r_from_it():
    policy = ElasticBSP(3, lookahead=4, replan="overdue")
    pushes(policy, MONITOR + HELD + [LATE])
    after = [(0, 4.5), (1, 4.5), (2, 4.9), (0, 5.5), (1, 5.5), (2, 6.3), (0, 6.5), (1, 6.5)]
    assert pushes(policy, after) == [(0,), (1,), (2,), (0,), (1,), (), (), (0, 1, 2)]
    rows = tables(policy)
    assert len(rows["zipline"]) == 2  # the decision and the re-plan
    [barrier] = rows["barriers"]
    assert barrier["t_decided"] == 2.2 and barrier["t_released"] == 6.5
    assert barrier["observed_spread"] == pytest.approx(0.2)
    # pushes after the decision at 2.2, the held one included: 1 + 3, 1 + 3, 1 + 2
    assert {m["worker"]: m["r"] for m in rows["barrier_members"]} == {0: 4, 1: 4, 2: 3}


def test_a_barrier_moves_no_further_once_a_member_has_pushed_R_times_since_the_decision():
    # after the re-plan, workers 0 and 1 arrive at their fourth push since the decision (R = 4); worker 2
    # is late again at 7.0, but no member may push a fifth time before the barrier: the held wait
    policy = ElasticBSP(3, lookahead=4, replan="overdue")
    pushes(policy, MONITOR + HELD + [LATE])
    after = [(0, 4.5), (1, 4.5), (0, 5.5), (1, 5.5), (0, 6.5), (1, 6.5), (2, 7.0)]
    assert pushes(policy, after) == [(0,), (1,), (0,), (1,), (), (), (2,)]
    assert policy.replans == 1 and policy.held == {0, 1}


def test_the_replan_chooses_only_from_what_is_left_of_R():
    # R = 2: the same decision (r = 1, 1, 2); at the re-plan every member has pushed once since it,
    # so R' = 1: each member's next push is its barrier, its second after the decision
    policy = ElasticBSP(3, lookahead=2, replan="overdue")
    pushes(policy, MONITOR)
    assert policy.targets == {0: 3, 1: 3, 2: 4}
    assert pushes(policy, HELD + [LATE]) == [(), (), (0, 1, 2)]
    assert policy.targets == {0: 4, 1: 4, 2: 4}


# -- in a simulation: slow phases, many re-plans, the bound on pushes past a decision ------------------


def test_pushes_past_a_decision_stay_within_R_however_often_the_barrier_moves():
    rng = np.random.default_rng(7)
    jitter = {(w, k): rng.lognormal(0.0, 0.2) for w in range(4) for k in range(1, 121)}

    def compute(w, k, t):
        slow = 5.0 if (w == 3 and 20.0 <= t < 40.0) or (w == 1 and 60.0 <= t < 70.0) else 1.0
        return [1.0, 1.3, 1.7, 1.1][w] * jitter[w, k] * slow

    R = 6
    policy = ElasticBSP(4, lookahead=R, predictor="ema", ema_alpha=0.3, replan="overdue")
    run = simulate(policy, compute, iterations=120)
    assert policy.replans >= 3  # the slow phases moved barriers
    steady = before_first_leave(run)
    assert len(steady) >= 5
    for b in steady:
        members = [m for m in run.records["barrier_members"] if m["barrier"] == b["barrier"]]
        for m in members:
            after = [t for t, v, _ in run.pushes if v == m["worker"] and b["t_decided"] < t <= m["arrival_t"]]
            assert 1 <= m["r"] <= R and len(after) == m["r"]


# -- the option ------------------------------------------------------------------------------------


def test_replan_is_none_or_overdue_in_the_job_and_the_policy():
    assert load_job(None).sync.replan == "none"
    assert load_job(None, ["sync.replan=overdue"]).sync.replan == "overdue"
    with pytest.raises(ConfigError, match=r"sync\.replan"):
        load_job(None, ["sync.replan=always"])
    with pytest.raises(ValueError, match="replan"):
        ElasticBSP(2, replan="always")
    assert make_policy(SyncConfig(model="elasticbsp"), 3).replan == "none"
    assert make_policy(SyncConfig(model="elasticbsp", replan="overdue"), 3).replan == "overdue"
    assert model_label({"sync": {"model": "elasticbsp", "lookahead": 15, "zipline_z": "auto", "predictor": "ema",
                                 "replan": "overdue"}}) == "elasticbsp(R=15,z=auto,ema,replan=overdue)"
    assert model_label({"sync": {"model": "elasticbsp", "lookahead": 3, "replan": "none"}}) == "elasticbsp(R=3)"
    # config.py names the values itself; they must be what the policy accepts
    assert next(f for f in dataclasses.fields(SyncConfig) if f.name == "replan").metadata["choices"] == REPLAN
