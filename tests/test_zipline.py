"""ZipLine against brute force, on the authors' test vector, and the push-time predictor."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from ebsp_mpi.sync.predictor import PushPredictor
from ebsp_mpi.sync.zipline import ZipLineResult, zipline, zipline_brute, zipline_heap

AUTHORS = Path(__file__).resolve().parents[2] / "shared" / "data" / "elasticbsp-authors"


def assert_same(a: ZipLineResult, b: ZipLineResult) -> None:
    assert a.index.dtype == np.int64 and b.index.dtype == np.int64
    np.testing.assert_array_equal(a.index, b.index)
    assert a.spread == b.spread
    assert a.barrier_time == b.barrier_time
    assert a.cost == b.cost


def random_instance(rng: np.random.Generator, kind: int) -> np.ndarray:
    n, R = int(rng.integers(1, 6)), int(rng.integers(1, 6))
    if kind == 0:  # continuous times: no ties
        return np.sort(rng.uniform(0, 10, (n, R)), axis=1)
    if kind == 1:  # small integers: many ties, equal timestamps within and across rows
        return np.sort(rng.integers(0, 5, (n, R)), axis=1).astype(float)
    if kind == 2:  # the ElasticBSP shape: constant interval per worker, random offsets (integers)
        interval = rng.integers(1, 4, n)[:, None]
        return (rng.integers(0, 4, n)[:, None] + interval * np.arange(1, R + 1)).astype(float)
    # one or two distinct values only
    return np.sort(rng.choice([1.0, 2.0], (n, R)), axis=1)


@pytest.mark.parametrize("penalty", [0.0, 0.25, 1.0, 3.0])
def test_scan_and_heap_equal_brute_force_on_random_instances(penalty):
    rng = np.random.default_rng(1234 + int(penalty * 100))
    for trial in range(400):
        M = random_instance(rng, trial % 4)
        now = None if trial % 3 else float(rng.integers(-2, 6))
        expected = zipline_brute(M, penalty=penalty, now=now)
        assert_same(zipline(M, penalty=penalty, now=now), expected)
        assert_same(zipline_heap(M, penalty=penalty, now=now), expected)


def test_brute_force_result_is_the_minimum_over_all_combinations():
    rng = np.random.default_rng(7)
    for _ in range(50):
        M = random_instance(rng, 1)
        n, R = M.shape
        best = min(np.ptp(M[np.arange(n), idx]) for idx in np.ndindex(*(R,) * n))
        result = zipline(M)
        assert result.spread == best
        chosen = M[np.arange(n), result.index]
        assert result.barrier_time == chosen.max()
        assert result.spread == chosen.max() - chosen.min()


def test_ties_go_to_the_earliest_barrier():
    # spread 1 at barrier 2 ({1, 2}) and at barrier 6 ({5, 6}): the earlier wins
    r = zipline([[1.0, 5.0], [2.0, 6.0]])
    assert r.barrier_time == 2.0 and r.spread == 1.0
    np.testing.assert_array_equal(r.index, [0, 0])


def test_equal_timestamps_pick_the_latest_column_within_the_window():
    r = zipline([[1.0, 1.0, 3.0], [1.0, 2.0, 2.0]])
    assert (r.spread, r.barrier_time) == (0.0, 1.0)
    np.testing.assert_array_equal(r.index, [1, 0])


def test_penalty_trades_wait_for_an_earlier_barrier():
    M = [[0.0, 10.0], [3.0, 10.5]]
    plain = zipline(M)
    assert (plain.barrier_time, plain.spread) == (10.5, 0.5)
    tuned = zipline(M, penalty=1.0, now=0.0)
    assert (tuned.barrier_time, tuned.spread, tuned.cost) == (3.0, 3.0, 6.0)
    np.testing.assert_array_equal(tuned.index, [0, 0])
    # now defaults to M.min() = 0 here
    assert_same(zipline(M, penalty=1.0), tuned)


def test_single_worker_and_single_column():
    r = zipline([[4.0, 5.0, 9.0]])
    assert (r.spread, r.barrier_time) == (0.0, 4.0)
    np.testing.assert_array_equal(r.index, [0])
    r = zipline([[3.0], [1.0], [2.0]])
    assert (r.spread, r.barrier_time) == (2.0, 3.0)
    np.testing.assert_array_equal(r.index, [0, 0, 0])


@pytest.mark.parametrize("fn", [zipline, zipline_heap, zipline_brute])
@pytest.mark.parametrize("M, message", [
    ([1.0, 2.0], "2-D"),
    (np.zeros((0, 3)), "non-empty"),
    (np.zeros((2, 0)), "non-empty"),
    ([[1.0, np.nan]], "finite"),
    ([[1.0, np.inf]], "finite"),
    ([[1.0, 2.0], [3.0, 2.5]], r"row 1 has M\[1, 0\] = 3.0 > M\[1, 1\] = 2.5"),
    ([["a", "b"]], "numeric"),
])
def test_invalid_matrices_are_rejected(fn, M, message):
    with pytest.raises(ValueError, match=message):
        fn(M)


@pytest.mark.parametrize("fn", [zipline, zipline_heap, zipline_brute])
def test_invalid_penalty_and_now_are_rejected(fn):
    with pytest.raises(ValueError, match="penalty"):
        fn([[1.0]], penalty=-0.5)
    with pytest.raises(ValueError, match="now"):
        fn([[1.0]], penalty=1.0, now=float("nan"))


def test_brute_force_refuses_huge_instances():
    with pytest.raises(ValueError, match="combinations"):
        zipline_brute(np.tile(np.arange(50.0), (6, 1)))


# -- the authors' test vector -------------------------------------------------------------------


def authors_histories() -> dict[int, list[float]]:
    path = AUTHORS / "history_w1000.txt"
    if not path.exists():
        pytest.skip(f"the authors' test vector is not here: {path}")
    histories = {}
    for line in path.read_text().splitlines():
        if line.strip():
            worker, _, times = line.partition(":")
            histories[int(worker)] = [float(x) for x in times.split(",") if x.strip()]
    return histories


def authors_matrix(histories, R: int, first: int) -> np.ndarray:
    """The README's rule: t_last + k·(t_last − t_second_last), k = first .. first+R−1."""
    rows = []
    for worker in sorted(histories):
        h = histories[worker]
        rows.append(h[-1] + (h[-1] - h[-2]) * np.arange(first, first + R))
    return np.array(rows)


@pytest.mark.parametrize("R, expected", [(15, 1403.0), (20, 1400.0), (150, 1382.0)])
def test_authors_instance_minimum_spread(R, expected):
    histories = authors_histories()
    assert len(histories) == 1000
    M = authors_matrix(histories, R, first=0)
    result = zipline(M)
    assert result.spread == expected
    chosen = M[np.arange(len(M)), result.index]
    assert chosen.max() - chosen.min() == expected
    if R == 15:
        assert_same(zipline_heap(M), result)
        header = (AUTHORS / "dlist_w1000_R15.txt").read_text().splitlines()[0]
        assert header.replace(" ", "") == f"min_d={int(expected)}"


def test_authors_instance_future_pushes_through_the_predictor():
    histories = authors_histories()
    predictor = PushPredictor(len(histories))
    for worker, times in histories.items():
        for t in times:
            predictor.observe(worker, t)
    M = predictor.predict(sorted(histories), 15)
    np.testing.assert_array_equal(M, authors_matrix(histories, 15, first=1))
    assert zipline(M).spread == 1403.0


# -- the push-time predictor ------------------------------------------------------------------


def test_last_interval_rule_predicts_future_pushes():
    p = PushPredictor(2)
    for t in (0.0, 1.0, 3.0):
        p.observe(0, t)
    for t in (0.5, 1.0):
        p.observe(1, t)
    np.testing.assert_allclose(p.predict([1, 0], 3), [[1.5, 2.0, 2.5], [5.0, 7.0, 9.0]])
    np.testing.assert_allclose(p.predict([0], 2, first=0), [[3.0, 5.0]])
    assert p.interval(0) == 2.0


def test_ema_rule_smooths_intervals():
    p = PushPredictor(1, rule="ema", ema_alpha=0.5)
    for t in (0.0, 1.0, 4.0):  # intervals 1, 3 -> ema 1, then 0.5*3 + 0.5*1 = 2
        p.observe(0, t)
    assert p.interval(0) == 2.0
    np.testing.assert_allclose(p.predict([0], 2), [[6.0, 8.0]])


def test_median_rule_takes_the_median_of_the_recent_intervals():
    p = PushPredictor(1, rule="median")
    t = 0.0
    p.observe(0, t)
    for interval in (1.0, 9.0, 2.0):  # one outlier among three: the median is 2
        t += interval
        p.observe(0, t)
    assert p.interval(0) == 2.0
    p.reset()  # the recent intervals outlive a barrier; the one spanning it is never taken
    p.observe(0, 100.0)
    assert p.interval(0) != p.interval(0)  # NaN until this phase measured an interval
    p.observe(0, 103.0)
    assert p.interval(0) == 2.5  # median of 1, 9, 2, 3
    t = 103.0
    for interval in (4.0, 4.0, 4.0, 5.0):  # only the last MEDIAN_WINDOW (5) intervals count: 3, 4, 4, 4, 5
        t += interval
        p.observe(0, t)
    assert p.interval(0) == 4.0
    np.testing.assert_allclose(p.predict([0], 2), [[t + 4.0, t + 8.0]])


def test_reset_forgets_the_interval_spanning_a_barrier():
    for rule in ("last", "ema", "median"):
        p = PushPredictor(1, rule=rule)
        p.observe(0, 0.0)
        p.observe(0, 1.0)
        assert p.ready(0) and p.pushes(0) == 2
        p.reset()
        p.observe(0, 10.0)  # held at a barrier for 8 s: 1 -> 10 is no iteration time
        assert p.pushes(0) == 1 and not p.ready(0) and not p.ready(0, min_pushes=1)
        with pytest.raises(ValueError, match="worker 0"):
            p.predict([0], 2)
        p.observe(0, 11.0)
        assert p.ready(0) and not p.ready(0, min_pushes=3)
        np.testing.assert_allclose(p.predict([0], 2), [[12.0, 13.0]])


def test_an_overdue_worker_is_predicted_with_the_time_since_its_last_push():
    for rule in ("last", "ema", "median"):
        p = PushPredictor(3, rule=rule)
        for w, times in enumerate(((0.0, 1.0, 2.0), (1.0, 3.0), (3.5, 4.0))):
            for t in times:
                p.observe(w, t)
        # at 3.6: worker 0 (last 2, interval 1) is 0.6 late, so its interval is at least 1.6; worker 1
        # (next at 5) and worker 2 (next at 4.5) are not late
        np.testing.assert_allclose(p.predict([0, 1, 2], 3, now=3.6),
                                   [[3.6, 5.2, 6.8], [5.0, 7.0, 9.0], [4.5, 5.0, 5.5]])
        np.testing.assert_array_equal(p.predict([0, 1, 2], 3, now=3.0), p.predict([0, 1, 2], 3))  # on time
        np.testing.assert_allclose(p.predict([0], 2), [[3.0, 4.0]])  # without now: the rule's interval
        assert p.interval(0) == 1.0  # the widening is the decision's, not the history's


def test_predictor_validation():
    with pytest.raises(ValueError, match="rule"):
        PushPredictor(2, rule="mode")
    with pytest.raises(ValueError, match="ema_alpha"):
        PushPredictor(2, rule="ema", ema_alpha=0.0)
    with pytest.raises(ValueError, match="at least one worker"):
        PushPredictor(0)
    p = PushPredictor(2)
    with pytest.raises(ValueError, match="out of range"):
        p.observe(2, 0.0)
    p.observe(0, 5.0)
    with pytest.raises(ValueError, match="before its previous push"):
        p.observe(0, 4.0)
    with pytest.raises(ValueError, match="lookahead"):
        p.predict([0], 0)
