"""Staleness-aware updates (nn.staleness) against hand computations, and the store of held versions
(nn.versions) that DC-ASGD and the emulated trainer read the pulled weights from."""

import numpy as np
import pytest

from ebsp_mpi.nn.staleness import StalenessRule
from ebsp_mpi.nn.versions import VersionStore


def test_scale_divides_the_learning_rate_by_the_staleness():
    rule = StalenessRule("scale")
    assert rule.lr(0.1, 1) == 0.1
    assert rule.lr(0.1, 4) == pytest.approx(0.025)
    assert StalenessRule("none").lr(0.1, 4) == 0.1
    assert StalenessRule("dc").lr(0.1, 4) == 0.1
    with pytest.raises(ValueError, match="staleness must be >= 1"):
        rule.lr(0.1, 0)


def test_dc_adds_lambda_g_g_times_the_weights_moved_since_the_pull():
    g = np.array([1.0, 2.0, -3.0], dtype=np.float32)
    w_now = np.array([3.0, 5.0, 0.0], dtype=np.float32)
    w_pulled = np.array([1.0, 1.0, 2.0], dtype=np.float32)
    out = np.empty(3, dtype=np.float32)
    got = StalenessRule("dc", dc_lambda=0.5).gradient(g, w_now, w_pulled, out)
    # by hand: g + 0.5 * g^2 * (w_now - w_pulled) = [1 + 0.5*1*2, 2 + 0.5*4*4, -3 + 0.5*9*(-2)]
    np.testing.assert_array_equal(got, [2.0, 10.0, -12.0])
    assert got is out
    np.testing.assert_array_equal(g, [1.0, 2.0, -3.0])  # the pushed gradient itself is left as it came


def test_dc_on_the_current_weights_and_the_other_rules_give_the_gradient_itself():
    g, w = np.ones(3, dtype=np.float32), np.zeros(3, dtype=np.float32)
    scratch = np.empty_like(g)
    assert StalenessRule("dc").gradient(g, w, w, scratch) is g
    assert StalenessRule("none").gradient(g, w, w + 1, scratch) is g
    assert StalenessRule("scale").gradient(g, w, w + 1, scratch) is g


def test_bad_rules_are_refused():
    with pytest.raises(ValueError, match="must be one of none, scale, dc"):
        StalenessRule("adaptive")
    with pytest.raises(ValueError, match="dc_lambda"):
        StalenessRule("dc", dc_lambda=-1.0)


def test_a_held_version_is_copied_before_a_step_and_dropped_after_its_last_holder():
    w = np.zeros(4, dtype=np.float32)
    store = VersionStore(w)
    store.hold(0)
    store.hold(0)
    store.changing(1)        # version 0 is held: copied before the step
    w += 1.0
    np.testing.assert_array_equal(store.of(0), np.zeros(4))
    assert store.of(1) is w
    store.changing(2)        # version 1 is held by no one: not copied
    w += 1.0
    with pytest.raises(KeyError, match="version 1 is not held"):
        store.of(1)
    store.release(0)
    np.testing.assert_array_equal(store.of(0), np.zeros(4))  # one holder left
    store.release(0)
    with pytest.raises(KeyError):
        store.of(0)
    assert store.peak_copies == 1 and store.held == 0
    with pytest.raises(ValueError, match="released more often than held"):
        store.release(0)
    with pytest.raises(ValueError, match="weights are at version 2"):
        store.hold(1)


def test_bsp_like_holding_never_copies():
    """Every worker holds the current version and releases it before the round's step: no copy."""
    w = np.zeros(8, dtype=np.float32)
    store = VersionStore(w)
    for version in range(5):
        for _ in range(16):
            store.hold(version)
        for _ in range(16):
            store.release(version)
        store.changing(version + 1)
        w += 1.0
    assert store.peak_copies == 0
