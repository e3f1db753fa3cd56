"""Robust ZipLine (predictions as intervals M ± z·σ) against brute force, and z = 0 against ZipLine."""

from __future__ import annotations

import numpy as np
import pytest

from ebsp_mpi.sync.zipline import zipline, zipline_brute, zipline_robust, zipline_robust_brute


def random_instance(rng: np.random.Generator, kind: int) -> tuple[np.ndarray, np.ndarray]:
    """Small (M, σ); kinds 1-3 are integer-valued so that ties within and across rows are common."""
    n, R = int(rng.integers(1, 6)), int(rng.integers(1, 6))
    if kind == 0:  # continuous: no ties
        return np.sort(rng.uniform(0, 10, (n, R)), axis=1), rng.uniform(0, 3, (n, R))
    if kind == 1:  # ties everywhere, σ not monotone in k (rows of M ∓ zσ out of order)
        return np.sort(rng.integers(0, 5, (n, R)), axis=1).astype(float), rng.integers(0, 3, (n, R)).astype(float)
    if kind == 2:  # the ElasticBSP shape: constant interval, σ growing with k
        interval = rng.integers(1, 4, n)[:, None]
        M = (rng.integers(0, 4, n)[:, None] + interval * np.arange(1, R + 1)).astype(float)
        return M, 0.5 * rng.integers(0, 3, n)[:, None] * np.arange(1, R + 1)
    return np.sort(rng.choice([1.0, 2.0], (n, R)), axis=1), rng.choice([0.0, 0.5, 1.0], (n, R))


def assert_same(a, b) -> None:
    assert a.index.dtype == np.int64 and b.index.dtype == np.int64
    np.testing.assert_array_equal(a.index, b.index)
    assert (a.spread, a.barrier_time, a.interval_spread, a.upper, a.cost) == \
        (b.spread, b.barrier_time, b.interval_spread, b.upper, b.cost)


@pytest.mark.parametrize("penalty", [0.0, 0.25, 1.0])
@pytest.mark.parametrize("z", [0.5, 1.0, 2.0])
def test_robust_equals_brute_force_on_random_instances(z, penalty):
    rng = np.random.default_rng(int(100 * z + 1000 * penalty))
    for trial in range(300):
        M, sigma = random_instance(rng, trial % 4)
        now = None if trial % 3 else float(rng.integers(-2, 6))
        assert_same(zipline_robust(M, sigma, z, penalty=penalty, now=now),
                    zipline_robust_brute(M, sigma, z, penalty=penalty, now=now))


@pytest.mark.parametrize("penalty", [0.0, 0.5])
def test_z_zero_is_todays_zipline(penalty):
    rng = np.random.default_rng(5)
    for trial in range(400):
        M, sigma = random_instance(rng, trial % 4)
        expected = zipline(M, penalty=penalty)
        for result in (zipline_robust(M, sigma, 0.0, penalty=penalty),
                       zipline_robust_brute(M, sigma, 0.0, penalty=penalty)):
            np.testing.assert_array_equal(result.index, expected.index)
            assert (result.spread, result.barrier_time, result.cost) == \
                (expected.spread, expected.barrier_time, expected.cost)
            assert (result.interval_spread, result.upper) == (expected.spread, expected.barrier_time)
    # and on the benchmark's shape, too large for brute force
    M = np.sort(rng.uniform(0, 1000, (300, 40)), axis=1)
    a, b = zipline_robust(M, np.ones_like(M), 0.0), zipline(M)
    np.testing.assert_array_equal(a.index, b.index)
    assert (a.spread, a.cost) == (b.spread, b.cost)
    assert_same(zipline_robust(M[:3, :4], np.ones((3, 4)), 0.0), zipline_robust_brute(M[:3, :4], np.ones((3, 4)), 0.0))
    assert zipline_brute(M[:3, :4]).spread == zipline_robust(M[:3, :4], np.zeros((3, 4)), 1.0).spread


def test_uncertain_worker_is_synchronised_early():
    # worker 1's far predictions are uncertain: the paper's ZipLine aligns both at their 3rd push
    # (spread 0), robust ZipLine at the 1st, where the intervals are narrow
    M = np.array([[1.0, 2.0, 3.0], [1.2, 2.1, 3.0]])
    sigma = np.array([[0.0, 0.0, 0.0], [0.1, 1.0, 2.0]])
    assert zipline(M).index.tolist() == [2, 2]
    r = zipline_robust(M, sigma, 1.0)
    assert r.index.tolist() == [0, 0]
    assert r.interval_spread == pytest.approx(1.3 - 1.0) and r.upper == pytest.approx(1.3)
    assert r.spread == pytest.approx(0.2) and r.barrier_time == 1.2


def test_equal_intervals_pick_the_largest_lower_end_then_the_last_column():
    M = np.array([[1.0, 2.0, 2.0], [2.0, 2.0, 5.0]])
    sigma = np.array([[0.0, 0.5, 0.5], [0.0, 0.0, 0.0]])
    r = zipline_robust(M, sigma, 1.0)
    assert_same(r, zipline_robust_brute(M, sigma, 1.0))
    assert r.index.tolist() == [0, 1]


@pytest.mark.parametrize("fn", [zipline_robust, zipline_robust_brute])
@pytest.mark.parametrize("sigma, z, message", [
    (np.ones((2, 3)), 1.0, "shape"),
    (-np.ones((2, 2)), 1.0, "sigma must be finite and >= 0"),
    (np.full((2, 2), np.nan), 1.0, "sigma must be finite"),
    (np.ones((2, 2)), -1.0, "z must be finite and >= 0"),
    (np.ones((2, 2)), np.inf, "z must be finite"),
])
def test_invalid_sigma_and_z_are_rejected(fn, sigma, z, message):
    with pytest.raises(ValueError, match=message):
        fn([[1.0, 2.0], [1.5, 2.5]], sigma, z)
