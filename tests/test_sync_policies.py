"""BSP, ASP, SSP(s), DSSP(s, r), their registry and the discrete-event simulator.

Three kinds of tests: exact scripted event sequences through the policy API (who is held, who is
released, when), exact simulated timelines for "three workers, one three times slower", and property
tests on random timelines that check each model's invariants after every single event.
"""

import numpy as np
import pytest

from ebsp_mpi.sync.asp import ASP
from ebsp_mpi.sync.base import NOTHING, Decision, SyncPolicy
from ebsp_mpi.sync.bsp import BSP
from ebsp_mpi.config import SyncConfig
from ebsp_mpi.sync.dssp import DSSP
from ebsp_mpi.sync.elastic import ElasticBSP
from ebsp_mpi.sync.registry import POLICIES, make_policy
from ebsp_mpi.sim.events import SimulationDeadlock, simulate
from ebsp_mpi.sync.ssp import SSP

# ---------------------------------------------------------------------------------------------------
# helpers


def play(policy, script):
    """Feed ("push" | "leave", worker, t) events; return the released tuples, one per event."""
    out = []
    for kind, worker, t in script:
        decision = policy.on_push(worker, t) if kind == "push" else policy.on_leave(worker, t)
        out.append(decision.release)
    return out


def push(w, t):
    return ("push", w, t)


def leave(w, t):
    return ("leave", w, t)


def release_times(result, worker):
    return [r for r, _ in result.iterations[worker]]


ONE_SLOW = [1.0, 1.0, 3.0]  # three workers, worker 2 three times slower


# ---------------------------------------------------------------------------------------------------
# BSP


def test_bsp_round_releases_everyone_together_and_applies_once():
    p = BSP(3)
    assert p.round_based and p.start(0.0) == Decision(release=(0, 1, 2))
    assert p.on_push(0, 1.0) == NOTHING
    assert p.on_push(1, 1.0) == NOTHING
    assert p.held == {0, 1}
    assert p.on_push(2, 3.0) == Decision(release=(0, 1, 2), apply_round=True)
    assert p.held == set()
    # second round, the slow worker first this time
    assert p.on_push(2, 6.0) == NOTHING
    assert p.on_push(0, 6.5) == NOTHING
    assert p.on_push(1, 7.0) == Decision(release=(0, 1, 2), apply_round=True)
    assert p.done.tolist() == [2, 2, 2]
    assert p.take_records() == []  # BSP is silent in the trace


def test_bsp_leaver_completes_round_when_the_others_have_pushed():
    p = BSP(3)
    p.start(0.0)
    p.on_push(0, 1.0)
    p.on_push(1, 1.0)
    assert p.on_leave(2, 2.0) == Decision(release=(0, 1), apply_round=True)
    assert p.active == {0, 1} and p.held == set()
    # rounds go on with the two left
    assert p.on_push(1, 3.0) == NOTHING
    assert p.on_push(0, 3.5) == Decision(release=(0, 1), apply_round=True)


def test_bsp_leaver_does_not_complete_a_round_others_still_owe():
    p = BSP(3)
    p.start(0.0)
    p.on_push(0, 1.0)  # held, and then leaves with its gradient in the round
    assert p.on_leave(0, 1.0) == NOTHING
    assert p.on_leave(2, 1.5) == NOTHING  # worker 1 has not pushed this round
    assert p.on_push(1, 2.0) == Decision(release=(1,), apply_round=True)


def test_bsp_last_leaver_frees_nobody():
    p = BSP(2)
    p.start(0.0)
    assert p.on_leave(0, 1.0) == NOTHING
    assert p.on_leave(1, 1.0) == NOTHING
    assert p.active == set()


def test_the_active_index_follows_every_departure():
    """PSP draws its samples from ``active_index``; it is built again only when asked after a departure
    (rebuilding it at each of n departures made a 100,000-worker simulation quadratic)."""
    p = ASP(6)
    p.start(0.0)
    assert p.active_index.tolist() == [0, 1, 2, 3, 4, 5]
    for w in (3, 0, 5):
        p.on_leave(w, 1.0)
        assert p.active_index.tolist() == sorted(p.active) and p.active_sorted() == tuple(sorted(p.active))
    assert p.active_index.tolist() == [1, 2, 4] and p.active_index.dtype == np.int64


# ---------------------------------------------------------------------------------------------------
# ASP


def test_asp_releases_every_pusher_at_once():
    p = ASP(3)
    script = [push(0, 1.0), push(1, 1.0), push(0, 2.0), push(0, 3.0), push(2, 3.0), leave(1, 3.5),
              push(0, 4.0)]
    assert play(p, script) == [(0,), (1,), (0,), (0,), (2,), (), (0,)]
    assert p.held == set() and not p.round_based
    assert p.done.tolist() == [4, 1, 1]


# ---------------------------------------------------------------------------------------------------
# SSP


def test_ssp_three_workers_one_slow_scripted():
    p = SSP(3, staleness=1)
    script = [
        push(0, 1.0), push(1, 1.0),  # lead 1 <= s: go on
        push(0, 2.0), push(1, 2.0),  # lead 2 > s: held
        push(2, 3.0),  # the slowest pushes: min rises to 1, both are back within s
        push(0, 4.0), push(1, 4.0),
        push(2, 6.0),
    ]
    assert play(p, script) == [(0,), (1,), (), (), (0, 1, 2), (), (), (0, 1, 2)]
    assert p.take_records() == []


def test_ssp_push_of_the_slowest_releases_only_those_back_within_bound():
    p = SSP(3, staleness=1)
    script = [push(0, 1), push(0, 2), push(1, 2), push(2, 3)]
    # worker 0 (lead 2) held; 1 and 2 push once: min becomes 1 -> worker 0 is back at lead 1
    assert play(p, script) == [(0,), (), (1,), (0, 2)]
    p = SSP(3, staleness=1)
    script = [push(0, 1), push(0, 2), push(2, 3)]  # worker 1 still at 0: min does not move
    assert play(p, script) == [(0,), (), (2,)]
    assert p.held == {0}


def test_ssp_zero_is_lockstep():
    p = SSP(2, staleness=0)
    assert play(p, [push(0, 1), push(1, 2), push(1, 3), push(0, 4)]) == [(), (0, 1), (), (0, 1)]


def test_ssp_leaver_releases_workers_it_held_back():
    p = SSP(3, staleness=1)
    play(p, [push(0, 1), push(1, 1), push(0, 2), push(1, 2)])
    assert p.held == {0, 1}
    assert p.on_leave(2, 2.5) == Decision(release=(0, 1))
    assert p.held == set() and p.min_done() == 2


def test_ssp_leaver_that_was_held_frees_nobody_else_needlessly():
    p = SSP(3, staleness=0)
    play(p, [push(0, 1), push(1, 1)])
    assert p.held == {0, 1}
    assert p.on_leave(0, 1.5) == NOTHING  # worker 2 still owes its first push
    assert p.on_push(2, 2.0) == Decision(release=(1, 2))


# ---------------------------------------------------------------------------------------------------
# DSSP


def test_dssp_three_workers_one_slow_scripted():
    p = DSSP(3, staleness=1, dssp_range=3)
    p.start(0.0)
    script = [
        push(0, 1), push(1, 1),  # within s
        push(0, 2), push(1, 2),  # past s, but worker 2 has no push yet: r* = 0, as SSP
        push(2, 3),  # min rises: released
        push(0, 4), push(1, 4),  # worker 2 has one push only (start-up): still r* = 0
        push(2, 6),
    ]
    assert play(p, script) == [(0,), (1,), (), (), (0, 1, 2), (), (), (0, 1, 2)]
    assert p.last_plan.extra == 0 and p.last_plan.slowest_push is None
    # t = 7: worker 2 (interval 6 - 3 = 3 s, released at 6) is predicted at 9; worker 0 (1 s) lands on
    # 7, 8, 9, 10 for r* = 0..3: r* = 2 is closest, so its threshold becomes s + 2 = 3
    assert p.on_push(0, 7.0) == Decision(release=(0,))
    plan = p.last_plan
    assert (plan.worker, plan.lead, plan.extra, plan.threshold) == (0, 2, 2, 3)
    assert plan.interval == pytest.approx(1.0) and plan.slowest_push == pytest.approx(9.0)
    assert p.on_push(1, 7.0) == Decision(release=(1,))
    calls = p.controller_calls
    assert play(p, [push(0, 8), push(1, 8)]) == [(0,), (1,)]  # lead 3 <= 3: within the plan
    assert p.controller_calls == calls  # no new prediction inside a plan
    assert play(p, [push(0, 9), push(1, 9)]) == [(), ()]  # lead 4: the planned hold
    assert p.on_push(2, 9.0) == Decision(release=(0, 1, 2))  # ... ends at the predicted push
    # t = 10, lead 4: one more iteration allowed (s + r = 4); 11 is closer to 12 than 10 is
    assert p.on_push(0, 10.0) == Decision(release=(0,))
    assert (p.last_plan.extra, p.last_plan.threshold, p.last_plan.slowest_push) == (1, 4, pytest.approx(12.0))
    assert p.on_push(0, 11.0) == NOTHING  # lead 5 > s + r: never further
    assert p.threshold[0] == 4


def test_dssp_resets_threshold_when_back_within_lower_bound():
    p = DSSP(2, staleness=1, dssp_range=5)
    p.start(0.0)
    script = [push(0, 1), push(0, 2), push(1, 4), push(0, 5), push(1, 8)]  # 0 takes 1 s, 1 takes 4 s
    assert play(p, script) == [(0,), (), (0, 1), (), (0, 1)]
    assert p.on_push(0, 9.0) == Decision(release=(0,))  # lead 2: worker 1 predicted at 8 + 4 = 12
    assert (p.last_plan.extra, p.threshold[0], p.last_plan.slowest_push) == (3, 4, 12.0)
    assert play(p, [push(1, 9.5), push(1, 9.8)]) == [(1,), (1,)]  # the slow worker speeds up
    assert p.on_push(0, 10.0) == Decision(release=(0,))  # lead 1: back within s ...
    assert p.threshold[0] == 1  # ... so the threshold is s again
    calls = p.controller_calls
    # lead 2 again: a fresh prediction (worker 1 now takes 0.3 s: next push at 10.1) holds worker 0
    assert p.on_push(0, 11.0) == NOTHING
    assert p.controller_calls == calls + 1
    assert p.last_plan.slowest_push == pytest.approx(10.1) and p.last_plan.extra == 0


def test_dssp_ties_go_to_fewer_extra_iterations():
    def prepared():
        p = DSSP(2, staleness=0, dssp_range=3)
        p.start(0.0)
        # worker 0 takes 2 s, worker 1 takes 3 s; with under two pushes each, r* = 0 (as SSP)
        assert play(p, [push(0, 2), push(1, 3), push(0, 5), push(1, 6)]) == [(), (0, 1), (), (0, 1)]
        return p

    p = prepared()
    # worker 1 is predicted at 6 + 3 = 9; worker 0 (2 s) would push at 8 or 10: |8-9| = |10-9|, a tie
    assert p.on_push(0, 8.0) == NOTHING
    assert (p.last_plan.extra, p.last_plan.interval, p.last_plan.slowest_push) == (0, 2.0, 9.0)
    p = prepared()
    # control: 1.9 s per iteration puts the next push at 9.8, closer than 7.9 to 9, so one more
    assert p.on_push(0, 7.9) == Decision(release=(0,))
    assert p.last_plan.extra == 1


def test_dssp_never_grants_more_than_r():
    p = DSSP(2, staleness=0, dssp_range=2)
    p.start(0.0)
    # worker 1 takes 10 s, worker 0 takes 1 s
    assert play(p, [push(0, 1), push(1, 10), push(0, 11), push(1, 20)]) == [(), (0, 1), (), (0, 1)]
    assert p.on_push(0, 21.0) == Decision(release=(0,))  # worker 1 predicted at 30: as far as allowed
    assert (p.last_plan.extra, p.threshold[0]) == (2, 2)
    assert play(p, [push(0, 22), push(0, 23)]) == [(0,), ()]
    assert p.lead(0) == 3 and p.held == {0}


def test_dssp_without_range_is_ssp_on_a_script():
    script = [push(0, 1), push(1, 1), push(0, 2), push(1, 2), push(2, 3), push(0, 4), push(1, 4),
              push(2, 6), push(0, 7), push(1, 7), push(2, 9)]
    ssp, dssp = SSP(3, staleness=1), DSSP(3, staleness=1, dssp_range=0)
    ssp.start(0.0), dssp.start(0.0)
    assert play(dssp, script) == play(ssp, script)


def test_dssp_leaver_releases_held_workers_and_restarts_their_clock():
    p = DSSP(3, staleness=0, dssp_range=2)
    p.start(0.0)
    assert play(p, [push(0, 1), push(1, 1)]) == [(), ()]
    assert p.on_leave(2, 1.5) == Decision(release=(0, 1))
    assert p.on_push(0, 2.5) == NOTHING  # lead 1; worker 1 has one push only: r* = 0
    assert p.last_plan.interval == pytest.approx(1.0)  # measured from the release at the leave


# ---------------------------------------------------------------------------------------------------
# the simulator: exact timelines for three workers, one three times slower (s = 1, r = 3)


def test_sim_bsp_one_slow():
    res = simulate(BSP(3), ONE_SLOW, 8)
    for w in range(3):
        assert release_times(res, w) == [0, 3, 6, 9, 12, 15, 18, 21]
    assert res.wait.tolist() == [14.0, 14.0, 0.0]  # 7 rounds x 2 s for the fast ones
    assert res.makespan == 24.0
    assert all(r.apply_round for r in res.releases[1:])


def test_sim_asp_one_slow():
    res = simulate(ASP(3), ONE_SLOW, 8)
    assert release_times(res, 0) == [0, 1, 2, 3, 4, 5, 6, 7]
    assert release_times(res, 2) == [0, 3, 6, 9, 12, 15, 18, 21]
    assert res.wait.tolist() == [0.0, 0.0, 0.0]


def test_sim_ssp_one_slow():
    res = simulate(SSP(3, staleness=1), ONE_SLOW, 8)
    # fast workers: go on at 1, held at 2 until the slow push at 3, then every 3 s after it
    assert release_times(res, 0) == release_times(res, 1) == [0, 1, 3, 6, 9, 12, 15, 18]
    assert release_times(res, 2) == [0, 3, 6, 9, 12, 15, 18, 21]
    assert res.wait.tolist() == [11.0, 11.0, 0.0]
    assert res.waits(0) == [0, 1, 2, 2, 2, 2, 2]


def test_sim_dssp_one_slow():
    res = simulate(DSSP(3, staleness=1, dssp_range=3), ONE_SLOW, 8)
    # as SSP until worker 2 has two pushes (t = 6); then r* = 2 at t = 7, and r* = 1 at t = 10
    assert release_times(res, 0) == release_times(res, 1) == [0, 1, 3, 6, 7, 8, 9, 10]
    assert res.waits(0) == [0, 1, 2, 0, 0, 0, 0]
    assert res.wait.tolist() == [3.0, 3.0, 0.0]


def test_sim_ssp_zero_matches_bsp_timeline():
    ssp, bsp = simulate(SSP(3, staleness=0), ONE_SLOW, 6), simulate(BSP(3), ONE_SLOW, 6)
    assert ssp.iterations == bsp.iterations


# ---------------------------------------------------------------------------------------------------
# the simulator itself


def test_siminterval_function_gets_worker_and_iteration():
    seen = []

    def interval(w, k):
        seen.append((w, k))
        return 1.0 + w + 0.5 * k

    res = simulate(ASP(2), interval, 3)
    assert sorted(seen) == [(0, 0), (0, 1), (0, 2), (1, 0), (1, 1), (1, 2)]
    assert res.iterations[1] == [(0.0, 2.0), (2.0, 4.5), (4.5, 7.5)]


def test_sim_is_deterministic_with_simultaneous_pushes():
    a = simulate(DSSP(4, staleness=1, dssp_range=2), [1, 1, 2, 2], 12)
    b = simulate(DSSP(4, staleness=1, dssp_range=2), [1, 1, 2, 2], 12)
    assert a.iterations == b.iterations and a.releases == b.releases


def test_sim_argument_errors():
    with pytest.raises(ValueError, match="one per worker"):
        simulate(ASP(3), [1.0, 2.0], 2)
    with pytest.raises(ValueError, match="worker 1, iteration 0"):
        simulate(ASP(2), [1.0, -1.0], 2)
    with pytest.raises(ValueError, match="got nan"):
        simulate(ASP(2), lambda w, k: float("nan"), 2)
    with pytest.raises(ValueError, match="iterations"):
        simulate(ASP(2), [1.0, 1.0], 0)


class NeverRelease(SyncPolicy):
    name = "never"

    def _decide_push(self, worker, t):
        return NOTHING


class ReleaseEveryone(SyncPolicy):
    name = "everyone"

    def _decide_push(self, worker, t):
        return Decision(release=tuple(sorted(self.active)))


def test_sim_reports_deadlock_and_bogus_releases():
    with pytest.raises(SimulationDeadlock, match=r"holds workers \[0, 1\]"):
        simulate(NeverRelease(2), [1.0, 1.0], 3)
    with pytest.raises(RuntimeError, match="was not pending"):
        simulate(ReleaseEveryone(2), [1.0, 2.0], 3)


# ---------------------------------------------------------------------------------------------------
# property tests: random timelines, invariants checked after every event


class Spy:
    """A policy wrapper for :func:`simulate`: ``check(policy, kind, worker, decision)`` after each event."""

    def __init__(self, policy, check):
        self.policy, self.check = policy, check

    def __getattr__(self, name):
        return getattr(self.policy, name)

    def start(self, t):
        return self.policy.start(t)

    def on_push(self, worker, t):
        decision = self.policy.on_push(worker, t)
        self.check(self.policy, "push", worker, decision)
        return decision

    def on_leave(self, worker, t):
        decision = self.policy.on_leave(worker, t)
        self.check(self.policy, "leave", worker, decision)
        return decision


def lead(p, w):
    return int(p.done[w]) - p.min_done()


def random_intervals(seed, n, iterations):
    """Per-worker base speeds (worker 2 three times slower) with log-normal jitter, or on an integer grid."""
    rng = np.random.default_rng(seed)
    base = rng.uniform(0.5, 2.0, n)
    if n > 2:
        base[2] = 3.0 * base.max()
    if seed % 3 == 0:  # integer intervals: many simultaneous pushes
        table = np.round(base[:, None] * rng.integers(1, 3, (n, iterations)))
    else:
        table = base[:, None] * rng.lognormal(0.0, 0.3, (n, iterations))
    return lambda w, k: float(table[w, k])


CASES = [(seed, n) for seed in range(12) for n in (2, 3, 5, 8)]
K = 25


@pytest.mark.parametrize("seed,n", CASES)
def test_property_bsp(seed, n):
    def check(p, kind, worker, d):
        if d.release:
            assert d.apply_round and d.release == tuple(sorted(p.active))
            assert len({int(p.done[w]) for w in p.active}) == 1  # the round: equal pushes
        else:
            assert not d.apply_round
            assert not p.active or not p.held >= p.active

    res = simulate(Spy(BSP(n), check), random_intervals(seed, n, K), K)
    assert all(len(it) == K for it in res.iterations)
    for k in range(K):  # iteration k starts at the same time everywhere, after every push of k - 1
        starts = {res.iterations[w][k][0] for w in range(n)}
        assert len(starts) == 1
        if k:
            assert starts.pop() == max(res.iterations[w][k - 1][1] for w in range(n))


@pytest.mark.parametrize("seed,n", CASES)
def test_property_asp(seed, n):
    def check(p, kind, worker, d):
        assert p.held == set()
        if kind == "push":
            assert d.release == (worker,)

    res = simulate(Spy(ASP(n), check), random_intervals(seed, n, K), K)
    assert res.wait.tolist() == [0.0] * n


@pytest.mark.parametrize("s", [0, 1, 3])
@pytest.mark.parametrize("seed,n", CASES[::2])
def test_property_ssp(seed, n, s):
    def check(p, kind, worker, d):
        for w in d.release:
            assert lead(p, w) <= s  # nobody starts an iteration more than s ahead
        for w in p.held:
            assert lead(p, w) > s  # and nobody who may go on is kept waiting

    res = simulate(Spy(SSP(n, staleness=s), check), random_intervals(seed, n, K), K)
    assert all(len(it) == K for it in res.iterations)  # no deadlock
    assert all(r.leads() and max(r.leads()) <= s for r in res.releases)
    if s == 0:  # lockstep: iteration k starts only after everyone pushed iteration k - 1
        for k in range(1, K):
            last_push = max(res.iterations[w][k - 1][1] for w in range(n))
            assert all(res.iterations[w][k][0] >= last_push for w in range(n))


@pytest.mark.parametrize("s,r", [(0, 1), (1, 2), (3, 3), (0, 5)])
@pytest.mark.parametrize("seed,n", CASES[::2])
def test_property_dssp(seed, n, s, r):
    grants = []

    def check(p, kind, worker, d):
        assert np.all((p.threshold >= s) & (p.threshold <= s + r))
        for w in d.release:
            assert lead(p, w) <= s + r  # never beyond s + r
            assert lead(p, w) <= p.threshold[w]
        if kind == "push" and lead(p, worker) <= s:
            assert worker in d.release  # within the lower bound: as SSP, at once
        for w in p.held:
            assert s < lead(p, w) <= s + r + 1
            assert lead(p, w) > p.threshold[w]  # held only past its own threshold
        grants.append(p.last_plan.extra if p.last_plan else 0)

    res = simulate(Spy(DSSP(n, staleness=s, dssp_range=r), check), random_intervals(seed, n, K), K)
    assert all(len(it) == K for it in res.iterations)  # no deadlock
    if n > 2 and seed % 3:  # a real straggler and jittered intervals: the controller does grant
        assert max(grants) > 0


@pytest.mark.parametrize("s", [0, 1, 3])
@pytest.mark.parametrize("seed,n", CASES[::3])
def test_property_dssp_without_range_equals_ssp(seed, n, s):
    intervals = random_intervals(seed, n, K)
    dssp = simulate(DSSP(n, staleness=s, dssp_range=0), intervals, K)
    ssp = simulate(SSP(n, staleness=s), intervals, K)
    assert dssp.iterations == ssp.iterations and dssp.releases == ssp.releases


# ---------------------------------------------------------------------------------------------------
# registry


def sync(model: str, **keys) -> SyncConfig:
    """A job's ``[sync]`` section naming `model`, with `keys` changed."""
    return SyncConfig(model=model, **keys)


def test_make_policy_builds_each_model_with_its_parameters():
    assert POLICIES == ("bsp", "asp", "ssp", "dssp", "elasticbsp", "psp")
    assert type(make_policy(sync("bsp"), 3)) is BSP
    assert type(make_policy(sync("asp"), 3)) is ASP
    ssp = make_policy(sync("ssp", staleness=2), 4)
    assert type(ssp) is SSP and ssp.staleness == 2 and ssp.workers == 4
    dssp = make_policy(sync("dssp", staleness=1, dssp_range=5), 2)
    assert type(dssp) is DSSP and (dssp.staleness, dssp.dssp_range) == (1, 5)
    assert make_policy(sync("ssp"), 2).staleness == 3 and make_policy(sync("dssp"), 2).dssp_range == 3
    for name in POLICIES:
        assert make_policy(sync(name), 2).name == name


def test_make_policy_passes_elasticbsp_parameters():
    policy = make_policy(sync("elasticbsp", lookahead=7, penalty=0.25, predictor="ema", ema_alpha=0.3), 5)
    assert type(policy) is ElasticBSP and policy.workers == 5
    assert (policy.lookahead, policy.penalty) == (7, 0.25)
    assert (policy.predictor.rule, policy.predictor.ema_alpha) == ("ema", 0.3)


def test_every_policy_counts_its_barriers():
    """``barriers`` is part of every policy's interface: a BSP round is one, ASP/SSP/DSSP have none."""
    for name in POLICIES[:4]:
        policy = make_policy(sync(name), 2)
        assert policy.barriers == 0
        policy.start(0.0)
        for t in range(1, 4):
            for w in (0, 1):
                if w not in policy.held:
                    policy.on_push(w, t + w / 10)
        assert policy.barriers == (3 if name == "bsp" else 0), name


def test_make_policy_errors():
    with pytest.raises(ValueError, match="unknown sync model 'sssp'") as err:
        make_policy(sync("sssp"), 3)
    assert all(name in str(err.value) for name in POLICIES)
    with pytest.raises(ValueError, match=r"staleness must be a non-negative integer.*-1"):
        make_policy(sync("ssp", staleness=-1), 3)
    with pytest.raises(ValueError, match="staleness"):
        make_policy(sync("dssp", staleness=-2), 3)
    with pytest.raises(ValueError, match=r"staleness.*1\.5"):
        make_policy(sync("ssp", staleness=1.5), 3)
    with pytest.raises(ValueError, match=r"staleness.*True"):
        make_policy(sync("ssp", staleness=True), 3)
    with pytest.raises(ValueError, match=r"dssp_range.*-1"):
        make_policy(sync("dssp", dssp_range=-1), 3)
    with pytest.raises(ValueError, match="at least one worker"):
        make_policy(sync("bsp"), 0)
