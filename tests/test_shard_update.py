"""The shard's update (``nn.shard_update``) without MPI: what a push or a BSP round does to the weights,
the code every server rank and the emulated trainer step them with."""

import itertools

import numpy as np
import pytest

from ebsp_mpi.nn import SGD
from ebsp_mpi.nn.shard_update import ShardUpdate
from ebsp_mpi.nn.staleness import StalenessRule
from ebsp_mpi.nn.versions import VersionStore

N = 12


def update(rule="none", lo=0, hi=N, versions=True, round_based=False, seed=0):
    rng = np.random.default_rng(seed)
    params = rng.standard_normal(N).astype(np.float32)
    opt = SGD(N, momentum=0.9, weight_decay=1e-4)
    store = VersionStore(params[lo:hi]) if versions else None
    return ShardUpdate(params, opt, lambda v: 0.1 / (1 + v), StalenessRule(rule, 0.5), lo, hi, store, round_based)


def grad(seed: int) -> np.ndarray:
    return np.random.default_rng(100 + seed).standard_normal(N).astype(np.float32)


def test_a_stale_push_under_scale_steps_at_the_rate_divided_by_its_staleness():
    u, ref = update("scale"), update("scale", versions=False)
    u.hold(0)
    g = grad(0)
    assert u.apply(0, g, version=3, used=1)  # staleness 3: rate 0.1 / 4 / 3
    SGD(N, momentum=0.9, weight_decay=1e-4).step(ref.params, g, 0.1 / 4 / 3)
    np.testing.assert_array_equal(u.params, ref.params)
    assert u.versions.held == 0  # the worker let go of its version with its push


def test_dc_corrects_against_the_weights_the_push_was_computed_on_kept_while_held():
    u = update("dc")
    u.hold(0)
    u.hold(1)
    pulled = u.params.copy()
    assert u.apply(1, grad(1), version=0, used=0)  # worker 0 still holds version 0: copied before the step
    np.testing.assert_array_equal(u.pulled_weights(0), pulled)
    g = grad(0)
    expected_step = StalenessRule("dc", 0.5).gradient(g, u.params.copy(), pulled, np.empty(N, np.float32))
    ref = u.params.copy()
    opt = SGD(N, momentum=0.9, weight_decay=1e-4)
    opt.velocity[...] = u.opt.velocity
    assert u.step_finite(0, g) and u.dc_ready == (0, 1)
    assert u.apply(0, g, version=1, used=0)
    opt.step(ref, expected_step, 0.1 / 2)
    np.testing.assert_array_equal(u.params, ref)
    assert u.versions.held == 0 and not u.versions.copies


def test_an_unchecked_step_that_is_not_finite_is_not_applied():
    u = update("dc")
    u.hold(0)
    u.hold(1)
    assert u.apply(1, grad(1), version=0, used=0)
    before = u.params.copy()
    bad = np.full(N, np.float32(1e30))
    assert not u.step_finite(0, bad)
    u.dc_ready = None  # not checked on these weights
    assert not u.apply(0, bad, version=1, used=0)
    np.testing.assert_array_equal(u.params, before)


@pytest.mark.parametrize("cuts", [[0, N], [0, 5, 9, N], [0, 1, 2, 3, N]])
def test_a_round_stepped_slice_by_slice_equals_one_step_over_the_whole_shard(cuts):
    whole, chunked = update(round_based=True, versions=False), update(round_based=True, versions=False)
    grads = [grad(k) for k in range(3)]
    whole.round_step(grads, slice(0, N), 2)
    for a, b in itertools.pairwise(cuts):
        chunked.round_step(grads, slice(a, b), 2)
    np.testing.assert_array_equal(whole.params, chunked.params)
    np.testing.assert_array_equal(whole.opt.velocity, chunked.opt.velocity)


def test_a_shard_changes_only_its_own_elements():
    u = update("scale", lo=4, hi=9)
    before = u.params.copy()
    u.hold(0)
    assert u.apply(0, grad(0)[4:9], version=0, used=0)
    assert not np.array_equal(u.params[4:9], before[4:9])
    np.testing.assert_array_equal(u.params[:4], before[:4])
    np.testing.assert_array_equal(u.params[9:], before[9:])
