"""The coordinator (``sync.coordinator``) on scripted events: what rank 0 decides, without MPI.

Every sync model is driven through it here; the MPI server and the simulator only carry its actions out.
"""

import math

import numpy as np
import pytest

from ebsp_mpi.config import SyncConfig
from ebsp_mpi.sync.base import Record
from ebsp_mpi.sync.coordinator import Apply, Coordinator, Executor, Reject, Reply, Round
from ebsp_mpi.sync.registry import POLICIES, make_policy


def coordinator(model: str, n: int, limit=None, stop_seconds=0.0, **sync) -> Coordinator:
    return Coordinator(make_policy(SyncConfig(model=model, **sync), n, seed=1), [limit] * n, stop_seconds)


def replies(actions) -> list[Reply]:
    out = []
    for a in actions:
        if isinstance(a, Round):
            out += a.replies
        elif isinstance(a, Reply):
            out.append(a)
    return out


def test_start_releases_every_worker_with_the_initial_weights():
    c = coordinator("asp", 3)
    assert c.start(0.0) == [Reply(0, 0, False), Reply(1, 0, False), Reply(2, 0, False)]


def test_asp_applies_each_push_as_a_step_and_answers_at_once():
    c = coordinator("asp", 2)
    c.start(0.0)
    assert c.push(1, 1.0) == [Apply(1, 0), Reply(1, 1, False)]
    assert c.push(0, 1.5) == [Apply(0, 1), Reply(0, 2, False)]
    assert c.version == 2 and c.pushes == [1, 1]


def test_bsp_closes_the_round_with_its_members_then_replies_with_the_new_version():
    c = coordinator("bsp", 3)
    c.start(0.0)
    assert c.push(2, 1.0) == [] and c.push(0, 1.1) == []
    actions = c.push(1, 1.2)
    assert actions == [Round((0, 1, 2), 0, (Reply(0, 1, False), Reply(1, 1, False), Reply(2, 1, False)))]
    assert c.version == 1


def test_a_rejected_push_is_counted_never_applied_and_a_round_of_rejects_takes_no_step():
    c = coordinator("bsp", 2)
    c.start(0.0)
    assert c.push(0, 1.0, rejected=True) == [Reject(0, 0)]
    actions = c.push(1, 1.1)
    assert actions == [Round((1,), 0, (Reply(0, 1, False), Reply(1, 1, False)))]
    c.push(0, 2.0, rejected=True)
    actions = c.push(1, 2.1, rejected=True)
    assert actions[:1] == [Reject(1, 1)]
    assert actions[1] == Round((), 1, (Reply(0, 1, False), Reply(1, 1, False)))  # no step: version stays 1
    assert c.rejected == 3 and c.version == 1
    asp = coordinator("asp", 1)
    asp.start(0.0)
    assert asp.push(0, 1.0, rejected=True) == [Reject(0, 0), Reply(0, 0, False)] and asp.version == 0


def test_a_worker_at_its_limit_gets_its_stop_reply_at_once_and_leaves():
    c = coordinator("ssp", 2, limit=2, staleness=0)
    c.start(0.0)
    c.push(0, 1.0)  # held: worker 1 has not pushed
    assert replies(c.push(1, 1.1)) == [Reply(0, 2, False), Reply(1, 2, False)]
    c.push(0, 2.0)  # its last push: stopped at once, not held
    actions = c.push(1, 2.1)
    assert replies(actions) == [Reply(1, 4, True)]
    assert c.finished and c.left == {0, 1}


def test_bsp_with_limits_ends_with_a_round_and_stop_replies():
    c = coordinator("bsp", 2, limit=1)
    c.start(0.0)
    assert replies(c.push(0, 1.0)) == [Reply(0, 0, True)]  # it stops; the round waits for worker 1
    assert c.push(1, 1.5) == [Round((0, 1), 0, (Reply(1, 1, True),))]
    assert c.finished and c.version == 1


def test_a_release_at_the_time_limit_is_a_stop_reply():
    c = coordinator("asp", 2, stop_seconds=5.0)
    c.start(0.0)
    assert replies(c.push(0, 4.9)) == [Reply(0, 1, False)]
    assert replies(c.push(1, 5.0)) == [Reply(1, 2, True)]
    assert not c.finished
    assert replies(c.push(0, 6.0)) == [Reply(0, 3, True)] and c.finished


def test_a_stop_request_stops_each_worker_at_its_next_pull():
    c = coordinator("asp", 2)
    c.start(0.0)
    c.request_stop()
    assert replies(c.push(0, 1.0)) == [Reply(0, 1, True)]
    assert replies(c.push(1, 1.0)) == [Reply(1, 2, True)] and c.finished


def test_a_push_after_the_stop_reply_is_refused():
    c = coordinator("asp", 1, limit=1)
    c.start(0.0)
    c.push(0, 1.0)
    with pytest.raises(ValueError, match="after its stop reply"):
        c.push(0, 2.0)


def test_elasticbsp_barriers_come_as_records_in_the_actions():
    c = coordinator("elasticbsp", 2, limit=30, lookahead=2)
    due = {w: (1.0 + 0.3 * w, w) for w, _, _ in c.start(0.0)}  # worker -> (its push time, worker)
    records = []
    while due:
        t, w = min(due.values())
        del due[w]
        actions = c.push(w, t)
        records += [a for a in actions if isinstance(a, Record)]
        for r in replies(actions):
            if not r.stop:
                due[r.worker] = (t + 1.0 + 0.3 * r.worker, r.worker)
    assert {r.table for r in records} >= {"zipline", "barriers"} and c.finished


def test_thousands_of_workers_leaving_in_one_chain_need_no_recursion():
    n = 5000
    c = coordinator("ssp", n, stop_seconds=1.0, staleness=0)
    c.start(0.0)
    for w in range(1, n):
        c.push(w, 0.5)  # held: worker 0 has not pushed
    actions = c.push(0, 2.0)  # past the time limit: every release is a stop, each departure releases more
    assert c.finished and sum(r.stop for r in replies(actions)) == n


@pytest.mark.parametrize("model", POLICIES)
def test_every_model_ends_every_worker_once_on_random_events(model):
    """Pushes in random order, some rejected; every worker pushes its limit and gets exactly one stop
    reply; a worker is answered only when its pull is pending; the version counts what was applied."""
    rng = np.random.default_rng(7)
    n, limit = 5, 12
    c = coordinator(model, n, limit=limit, staleness=1, dssp_range=2, lookahead=3, sample=2)
    pending = set()  # workers whose pull is answered and who will push next
    stops, applied, rounds = [0] * n, 0, 0
    t = 0.0

    def take(actions):
        nonlocal applied, rounds
        for a in actions:
            if isinstance(a, Apply):
                applied += 1
            if isinstance(a, Round) and a.members:
                rounds += 1
        for r in replies(actions):
            assert r.worker not in pending, f"{model}: worker {r.worker} answered twice"
            if r.stop:
                stops[r.worker] += 1
            else:
                pending.add(r.worker)

    take(c.start(t))
    while pending:
        w = int(rng.choice(sorted(pending)))
        pending.discard(w)
        t += float(rng.exponential(1.0))
        take(c.push(w, t, rejected=bool(rng.random() < 0.1)))
    assert stops == [1] * n and c.finished
    assert c.pushes == [limit] * n
    assert c.version == (rounds if c.policy.round_based else applied)
    assert not math.isnan(t)


def untimed(actions):
    """`actions` with the seconds a ZipLine call took left out of its record (no two runs agree)."""
    return [Record(a.table, {k: v for k, v in a.row.items() if k != "seconds"}) if isinstance(a, Record) else a
            for a in actions]


class Calls(Executor):
    """An executor that notes every call; its apply only when `steps` (None: the coordinator skips it)."""

    def __init__(self, steps: bool):
        self.calls = []
        if steps:
            self.apply = lambda worker, version: self.calls.append(Apply(worker, version))

    def reject(self, worker, iteration):
        self.calls.append(Reject(worker, iteration))

    def reply(self, worker, version, stop):
        self.calls.append(Reply(worker, version, stop))

    def round(self, members, version, released):
        after = version + 1 if members else version
        self.calls.append(Round(members, version, tuple(Reply(w, after, stop) for w, stop in released)))

    def record(self, record):
        self.calls.append(record)


@pytest.mark.parametrize("model", POLICIES)
@pytest.mark.parametrize("steps", [True, False])
def test_an_executor_is_called_with_the_actions_push_returns_in_their_order(model, steps):
    """push_to (the simulator's way, no records) and push (the server's, typed records) carry out the same
    decisions: the same events, with rejects, a time limit and iteration limits, give the same calls in the
    same order; an executor without an apply is not asked to apply."""
    rng = np.random.default_rng(3)
    n, sync = 6, dict(staleness=1, dssp_range=2, lookahead=2, sample=2)
    typed, called = (coordinator(model, n, limit=15, stop_seconds=25.0, **sync) for _ in range(2))
    executor = Calls(steps)
    pending = [a.worker for a in typed.start(0.0)]
    called.start_to(executor, 0.0)
    t = 0.0
    while pending:
        w = pending.pop(int(rng.integers(len(pending))))
        t += float(rng.exponential(0.3))
        rejected = bool(rng.random() < 0.1)
        executor.calls.clear()
        actions = typed.push(w, t, rejected)
        called.push_to(executor, w, t, rejected)
        assert untimed(executor.calls) == untimed([a for a in actions if steps or not isinstance(a, Apply)])
        pending += [r.worker for r in replies(actions) if not r.stop]
    assert typed.finished and called.finished and typed.version == called.version
