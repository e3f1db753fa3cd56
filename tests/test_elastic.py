"""ElasticBSP on scripted event sequences and in a small discrete-event simulation."""

from __future__ import annotations

import heapq
import itertools
import math
from dataclasses import dataclass, field

import numpy as np
import pytest

from ebsp_mpi.sync.elastic import ElasticBSP


def pushes(policy, events):
    """Feed ``(worker, t)`` pushes; return each decision's released workers as sorted tuples."""
    return [tuple(sorted(policy.on_push(w, t).release)) for w, t in events]


def tables(policy):
    out = {}
    for record in policy.take_records():
        out.setdefault(record.table, []).append(record.row)
    return out


# -- scripted: three workers, worker 2 slow -------------------------------------------------------
#
# intervals 1, 1, 2.5; worker 0 pushes at 1, 2, 3, ...; worker 1 at 1.5, 2.5, ...; worker 2 at 2.6,
# 5.1, 7.6, ... Monitoring ends at 5.1 (worker 2's second push). Predictions (R = 3) then are
#   worker 0: 6, 7, 8      worker 1: 5.5, 6.5, 7.5      worker 2: 7.6, 10.1, 12.6
# and the least spread is {8, 7.5, 7.6} (0.5, barrier at 8): r = (3, 3, 1).

MONITOR = [(0, 1.0), (1, 1.5), (0, 2.0), (1, 2.5), (2, 2.6), (0, 3.0), (1, 3.5), (0, 4.0),
           (1, 4.5), (0, 5.0)]
SUPERSTEP = [(1, 5.5), (0, 6.0), (1, 6.5), (0, 7.0), (1, 7.5), (2, 7.6), (0, 8.0)]


def test_monitoring_releases_every_push_until_all_have_two():
    policy = ElasticBSP(3, lookahead=3)
    assert policy.start(0.0).release == (0, 1, 2)
    assert pushes(policy, MONITOR) == [(w,) for w, _ in MONITOR]
    assert policy.phase == "monitor" and policy.targets == {}
    assert pushes(policy, [(2, 5.1)]) == [(2,)]  # the decision; worker 2 itself goes on
    assert policy.phase == "barrier"
    # done at the decision: 5, 4, 2; plus r = 3, 3, 1
    assert policy.targets == {0: 8, 1: 7, 2: 3}


def test_barrier_holds_arrivals_and_releases_all_on_the_last():
    clock = iter([10.0, 10.25])
    policy = ElasticBSP(3, lookahead=3, clock=lambda: next(clock))
    pushes(policy, MONITOR + [(2, 5.1)])
    released = pushes(policy, SUPERSTEP)
    assert released == [(1,), (0,), (1,), (0,), (), (), (0, 1, 2)]
    assert policy.held == set() and policy.barriers == 1 and policy.phase == "monitor"

    rows = tables(policy)
    assert rows["zipline"] == [dict(t=5.1, n=3, R=3, seconds=0.25)]
    [barrier] = rows["barriers"]
    assert barrier["barrier"] == 0 and barrier["t_decided"] == 5.1 and barrier["t_released"] == 8.0
    assert barrier["predicted_spread"] == pytest.approx(0.5)
    assert barrier["predicted_time"] == pytest.approx(8.0)
    assert barrier["observed_spread"] == pytest.approx(0.5)
    members = {m["worker"]: m for m in rows["barrier_members"]}
    assert [members[w]["r"] for w in range(3)] == [3, 3, 1]
    assert [members[w]["arrival_t"] for w in range(3)] == [8.0, 7.5, 7.6]
    assert [members[w]["predicted_t"] for w in range(3)] == pytest.approx([8.0, 7.5, 7.6])


def test_held_worker_stays_held_while_others_push():
    policy = ElasticBSP(3, lookahead=3)
    pushes(policy, MONITOR + [(2, 5.1)] + SUPERSTEP[:5])
    assert policy.held == {1}
    pushes(policy, [SUPERSTEP[5]])
    assert policy.held == {1, 2}
    with pytest.raises(ValueError, match="held"):
        policy.on_push(1, 7.7)


def test_next_superstep_monitors_again_from_the_barrier():
    policy = ElasticBSP(3, lookahead=3)
    pushes(policy, MONITOR + [(2, 5.1)] + SUPERSTEP)
    # the barrier push does not count: two more pushes each are needed
    assert pushes(policy, [(0, 9.0), (1, 9.0), (0, 10.0), (1, 10.0), (2, 10.6)]) == \
        [(0,), (1,), (0,), (1,), (2,)]
    assert policy.phase == "monitor"
    pushes(policy, [(2, 13.1)])
    assert policy.phase == "barrier"


def test_penalty_moves_the_barrier_earlier():
    policy = ElasticBSP(3, lookahead=3, penalty=10.0)
    pushes(policy, MONITOR + [(2, 5.1)])
    # barrier at 7.6 instead of 8: {7, 7.5, 7.6}, r = (2, 3, 1)
    assert policy.targets == {0: 7, 1: 7, 2: 3}


def test_a_worker_that_leaves_is_dropped_from_the_barrier():
    policy = ElasticBSP(3, lookahead=3)
    pushes(policy, MONITOR + [(2, 5.1)] + SUPERSTEP[:5])  # worker 1 held
    assert policy.on_leave(2, 7.6).release == ()
    assert policy.held == {1}
    assert pushes(policy, [(0, 8.0)]) == [(0, 1)]
    members = tables(policy)["barrier_members"]
    (left,) = [m for m in members if m["worker"] == 2]  # one barrier so far, which worker 2 left before
    assert math.isnan(left["arrival_t"])


def test_leave_of_the_last_missing_member_releases_the_held():
    policy = ElasticBSP(3, lookahead=3)
    pushes(policy, MONITOR + [(2, 5.1)] + SUPERSTEP[:6])  # workers 1 and 2 held
    assert policy.on_leave(0, 7.9).release == (1, 2)
    assert policy.barriers == 1 and policy.phase == "monitor"


def test_leave_during_monitoring_lets_the_others_decide():
    policy = ElasticBSP(3, lookahead=3)
    pushes(policy, MONITOR)  # worker 2 has pushed once only
    assert policy.phase == "monitor"
    assert policy.on_leave(2, 5.05).release == ()
    assert policy.phase == "barrier" and set(policy.targets) == {0, 1}


def test_single_worker_is_never_held():
    policy = ElasticBSP(1, lookahead=4)
    for k in range(1, 13):
        assert policy.on_push(0, float(k)).release == (0,)
    # monitoring 2 pushes, then the barrier on the next push (least spread 0, earliest): 3 per cycle
    assert policy.barriers == 4
    assert all(m["r"] == 1 for m in tables(policy)["barrier_members"])


def test_lookahead_one_puts_the_barrier_on_the_next_push():
    policy = ElasticBSP(3, lookahead=1)
    pushes(policy, MONITOR + [(2, 5.1)])
    assert policy.targets == {0: 6, 1: 5, 2: 3}


# worker 1 stalls after its push at 3.5 (interval 1): at the decision (5.1) its next push, predicted
# at 4.5, is 0.6 overdue. The paper's rows: 6, 7, 8 / 4.5, 5.5, 6.5 / 7.6, 10.1, 12.6, least spread
# {7, 6.5, 7.6} (1.1). Widened, worker 1's interval is 5.1 − 3.5 = 1.6: 5.1, 6.7, 8.3, and the least
# spread is {8, 8.3, 7.6} (0.7).
STALLED = [(0, 1.0), (1, 1.5), (0, 2.0), (1, 2.5), (2, 2.6), (0, 3.0), (1, 3.5), (0, 4.0), (0, 5.0),
           (2, 5.1)]


def test_overdue_widen_plans_a_late_worker_from_the_decision_time():
    paper, widened = ElasticBSP(3, lookahead=3), ElasticBSP(3, lookahead=3, overdue="widen")
    pushes(paper, STALLED)
    pushes(widened, STALLED)
    # done at the decision: 5, 3, 2
    assert paper.targets == {0: 7, 1: 6, 2: 3}
    assert widened.targets == {0: 8, 1: 6, 2: 3}
    assert widened._barrier.predicted_t == pytest.approx({0: 8.0, 1: 8.3, 2: 7.6})
    assert widened._barrier.predicted_spread == pytest.approx(0.7)


def test_parameters_are_validated():
    with pytest.raises(ValueError, match="lookahead"):
        ElasticBSP(2, lookahead=0)
    with pytest.raises(ValueError, match="penalty"):
        ElasticBSP(2, penalty=-1.0)
    with pytest.raises(ValueError, match="min_pushes"):
        ElasticBSP(2, min_pushes=1)
    with pytest.raises(ValueError, match="rule"):
        ElasticBSP(2, predictor="oracle")
    assert ElasticBSP(2).name == "elasticbsp" and not ElasticBSP(2).round_based


# -- a small discrete-event simulation -------------------------------------------------------------


@dataclass
class Run:
    pushes: list = field(default_factory=list)      # (t, worker, done after the push)
    releases: list = field(default_factory=list)    # (t, worker)
    records: dict = field(default_factory=dict)
    finished: dict = field(default_factory=dict)    # worker -> time of its last push


def simulate(policy, compute, iterations: int) -> Run:
    """Run workers whose iteration k (1-based) started at t takes ``compute(worker, k, t)`` seconds.

    A worker leaves right after its last push. Ties in time go to the lower worker index.
    """
    run = Run()
    queue = []

    def release(workers, t):
        for w in workers:
            run.releases.append((t, w))
            k = int(policy.done[w]) + 1
            heapq.heappush(queue, (t + compute(w, k, t), w))

    release(policy.start(0.0).release, 0.0)
    while queue:
        t, w = heapq.heappop(queue)
        decision = policy.on_push(w, t)
        run.pushes.append((t, w, int(policy.done[w])))
        released = list(decision.release)
        if policy.done[w] >= iterations:
            run.finished[w] = t
            # a worker that stops never pulls again; its push may have released others too
            released = [v for v in released if v != w] + list(policy.on_leave(w, t).release)
        release(released, t)
    for record in policy.take_records():
        run.records.setdefault(record.table, []).append(record.row)
    return run


def constant(intervals):
    return lambda w, k, t: intervals[w]


def before_first_leave(run):
    """Barriers released while every worker still ran (the run's end releases barriers by leaves)."""
    first_leave = min(run.finished.values())
    return [b for b in run.records["barriers"] if b["t_released"] < first_leave]


def test_simulation_finishes_and_every_barrier_holds_its_members():
    policy = ElasticBSP(4, lookahead=5)
    run = simulate(policy, constant([1.0, 1.1, 1.7, 3.0]), iterations=80)
    assert set(run.finished) == {0, 1, 2, 3}
    assert policy.barriers == len(run.records["barriers"])
    steady = before_first_leave(run)
    assert len(steady) >= 5
    for b in run.records["barriers"]:
        members = [m for m in run.records["barrier_members"] if m["barrier"] == b["barrier"]]
        arrived = [m["arrival_t"] for m in members if not math.isnan(m["arrival_t"])]
        assert b["t_released"] >= max(arrived)
        assert b["observed_spread"] == max(arrived) - min(arrived)
        if b in steady:  # released by the last arrival
            assert len(arrived) == 4 and b["t_released"] == max(arrived)


def test_no_worker_runs_more_than_r_pushes_past_a_decision():
    rng = np.random.default_rng(3)
    jitter = {(w, k): rng.lognormal(0.0, 0.2) for w in range(3) for k in range(1, 61)}
    policy = ElasticBSP(3, lookahead=6)
    run = simulate(policy, lambda w, k, t: [1.0, 1.5, 2.2][w] * jitter[w, k], iterations=60)
    steady = before_first_leave(run)
    assert len(steady) >= 4
    for b in steady:
        members = [m for m in run.records["barrier_members"] if m["barrier"] == b["barrier"]]
        assert len(members) == 3
        for m in members:
            w = m["worker"]
            after = [t for t, v, _ in run.pushes if v == w and b["t_decided"] < t <= m["arrival_t"]]
            # its r-th push after the decision is the held one (the decider's own push is at t_decided)
            assert 1 <= m["r"] <= 6
            assert len(after) == m["r"] and after[-1] == m["arrival_t"]
            # and that pull was answered only when the barrier released
            released = [t for t, v in run.releases if v == w and t >= m["arrival_t"]]
            assert released[0] == b["t_released"]


def test_staleness_within_a_superstep_is_bounded():
    intervals = [1.0, 1.4, 2.0, 3.0]
    rho, R, min_pushes = max(intervals) / min(intervals), 4, 2
    policy = ElasticBSP(4, lookahead=R)
    run = simulate(policy, constant(intervals), iterations=60)
    steady = before_first_leave(run)
    assert len(steady) >= 5
    cuts = [0.0] + [b["t_released"] for b in steady]
    for start, end in itertools.pairwise(cuts):
        per_worker = [sum(1 for t, w, _ in run.pushes if w == v and start < t <= end) for v in range(4)]
        # monitoring: until the slowest pushed twice (<= rho·2 pushes of the fastest), then <= R
        assert min(per_worker) >= min_pushes + 1
        assert max(per_worker) <= math.floor(rho * min_pushes) + R


def test_lookahead_one_in_simulation_is_a_barrier_on_every_next_push():
    policy = ElasticBSP(3, lookahead=1)
    run = simulate(policy, constant([1.0, 1.3, 2.0]), iterations=30)
    members = run.records["barrier_members"]
    assert policy.barriers >= 9
    assert all(m["r"] == 1 for m in members)
    # each release answers every worker still running
    for b in run.records["barriers"]:
        released = {w for t, w in run.releases if t == b["t_released"]}
        running = {w for w in range(3) if run.finished.get(w, math.inf) > b["t_released"]}
        assert released == running


def test_wrong_prediction_still_releases():
    policy = ElasticBSP(3, lookahead=5)

    def compute(w, k, t):
        # worker 2 turns 10x slower for the iterations it starts after the first decision
        slow = w == 2 and policy.phase == "barrier" and policy.barriers == 0
        return [1.0, 1.2, 2.0][w] * (10.0 if slow else 1.0)

    run = simulate(policy, compute, iterations=25)
    assert set(run.finished) == {0, 1, 2}
    first = run.records["barriers"][0]
    assert first["observed_spread"] > 10.0 > first["predicted_spread"] + 5.0
    assert first["t_released"] > first["predicted_time"] + 10.0
    assert policy.barriers >= 2
