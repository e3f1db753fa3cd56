"""The learned error scale σ_i(k) of the push-time predictions, and AutoZ's choice of z."""

from __future__ import annotations

import numpy as np
import pytest

from ebsp_mpi.sync.auto_z import GRID, AutoZ
from ebsp_mpi.sync.prediction_error import PredictionErrorModel


def test_no_error_seen_means_sigma_zero():
    m = PredictionErrorModel(3, 4)
    np.testing.assert_array_equal(m.sigma([0, 1, 2]), np.zeros((3, 4)))
    m.observe([], [], [])
    np.testing.assert_array_equal(m.sigma([2], R=2), np.zeros((1, 2)))


def test_ema_of_squared_errors_per_worker_and_k():
    m = PredictionErrorModel(2, 3, alpha=0.5, prior_weight=1.0)
    m.observe([0, 0], [1, 2], [0.1, -0.2])
    m.observe([0], [1], [0.3])
    E, c = m.state()
    assert E[0, 0] == pytest.approx(0.5 * 0.01 + 0.5 * 0.09) and E[0, 1] == pytest.approx(0.04)
    assert c[0].tolist() == [2, 1, 0] and c[1].tolist() == [0, 0, 0]


def test_short_history_leans_on_the_pooled_prior():
    m = PredictionErrorModel(3, 2, alpha=0.5, prior_weight=2.0)
    for _ in range(5):  # workers 0 and 1 err by 0.1 and 0.3 at k = 1
        m.observe([0, 1], [1, 1], [0.1, 0.3])
    pooled = m.pooled()
    assert pooled[0] == pytest.approx((0.01 + 0.09) / 2)
    s = m.sigma([0, 1, 2])[:, 0]
    # worker 2 has no history: the pooled prior alone; the others tend to their own error
    assert s[2] == pytest.approx(np.sqrt(pooled[0]))
    assert 0.1 < s[0] < s[2] < s[1] < 0.3
    m.observe([2], [1], [0.1])  # one own error pulls worker 2 a third of the way (c = 1, m = 2)
    assert m.sigma([2])[0, 0] ** 2 == pytest.approx(1 / 3 * 0.01 + 2 / 3 * ((2 + 1 * 0.01 / m.pooled()[0]) / 3)
                                                    * m.pooled()[0])


def test_unseen_lookahead_is_extrapolated_from_the_growth_seen():
    m = PredictionErrorModel(4, 6, alpha=1.0)
    # variance growing as k**1.5 over k = 1..3 for every worker
    for k in (1, 2, 3):
        m.observe(range(4), [k] * 4, [0.01 * k ** 0.75] * 4)
    P = m.pooled()
    np.testing.assert_allclose(P[:3], 1e-4 * np.arange(1, 4) ** 1.5)
    np.testing.assert_allclose(P[3:], P[2] * (np.arange(4, 7) / 3) ** 1.5)
    # a worker twice as noisy as the pool where seen stays so where not seen
    m2 = PredictionErrorModel(2, 3, alpha=1.0, prior_weight=1e-9)
    m2.observe([0, 1], [1, 1], [0.01, 0.03])
    s = m2.sigma([0, 1])
    assert s[1, 2] / s[0, 2] == pytest.approx(3.0, rel=1e-6)
    assert m2.pooled()[2] == pytest.approx(m2.pooled()[0] * 9)  # one k seen: σ grows as k


def test_observe_checks_its_input():
    m = PredictionErrorModel(2, 3)
    with pytest.raises(ValueError, match="same length"):
        m.observe([0, 1], [1], [0.1, 0.2])
    with pytest.raises(ValueError, match="outside"):
        m.observe([0], [4], [0.1])
    with pytest.raises(ValueError, match="outside"):
        m.observe([2], [1], [0.1])
    with pytest.raises(ValueError, match="finite"):
        m.observe([0], [1], [np.nan])
    with pytest.raises(ValueError, match="R must be"):
        m.sigma([0], R=4)
    with pytest.raises(ValueError, match="alpha"):
        PredictionErrorModel(2, 3, alpha=0.0)
    with pytest.raises(ValueError, match="prior_weight"):
        PredictionErrorModel(2, 3, prior_weight=0.0)


# -- AutoZ -------------------------------------------------------------------------------------------


def feed(auto: AutoZ, ratio_of_z, barriers: int) -> list[float]:
    """Barriers whose observed spread is ratio_of_z(z) times an interval spread of 10 ms."""
    zs = []
    for _ in range(barriers):
        zs.append(auto.z)
        auto.observe(0.01 * ratio_of_z(auto.z), 0.01)
    return zs


def test_auto_z_climbs_until_the_intervals_cover_the_waiting():
    auto = AutoZ(window=3, hysteresis=0.1)
    zs = feed(auto, lambda z: 3.0 / (1.0 + z), 60)  # covered (ratio 1.0) from z = 2 on
    assert zs[:3] == [0.0] * 3 and zs[-1] == 2.0
    assert [z for _, z in auto.changes] == [0.5, 1.0, 1.5, 2.0]
    assert [b for b, _ in auto.changes] == [3, 6, 9, 12]


def test_auto_z_cannot_oscillate_whatever_the_waiting():
    rng = np.random.default_rng(3)
    for _ in range(50):
        auto = AutoZ(window=2, hysteresis=0.1)
        feed(auto, lambda z: float(rng.lognormal(0, 1)), 500)
        zs = [z for _, z in auto.changes]
        assert zs == sorted(zs) and len(zs) <= len(GRID) - 1  # one way, finitely often


def test_auto_z_excess_within_the_hysteresis_moves_nothing():
    auto = AutoZ(window=2, hysteresis=0.1)
    feed(auto, lambda z: 1.08, 20)
    assert auto.z == 0.0 and not auto.changes


def test_auto_z_median_ignores_one_blown_up_barrier_and_barriers_without_an_interval():
    auto = AutoZ(window=3, hysteresis=0.1)
    for ratio in (1.0, 50.0, 0.9):  # one slow phase: the median stays 1.0
        auto.observe(0.01 * ratio, 0.01)
    assert auto.z == 0.0
    auto.observe(float("nan"), 0.01)
    auto.observe(0.05, 0.0)
    auto.observe(0.05, float("nan"))
    assert auto.z == 0.0 and auto._ratios == []


def test_auto_z_stays_on_the_grids_end():
    auto = AutoZ(window=1, hysteresis=0.0)
    feed(auto, lambda z: 10.0, 30)
    assert auto.z == GRID[-1] and len(auto.changes) == len(GRID) - 1


def test_auto_z_validation():
    with pytest.raises(ValueError, match="window"):
        AutoZ(window=0)
    with pytest.raises(ValueError, match="hysteresis"):
        AutoZ(hysteresis=-0.1)
    with pytest.raises(ValueError, match="grid"):
        AutoZ(grid=(1.0, 0.5))
