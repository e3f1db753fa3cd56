"""Sufficient factors of dense layers (Poseidon's SFB): the layout, the model filling it, the rebuild.

The rebuilt weight gradient must equal the dense one, for one worker and as the mean over P workers
(what BSP with SFB must reproduce of the oracle, which averages dense gradients in worker order). Each
body runs with ``xp = numpy`` and, marked ``gpu``, with CuPy where a CUDA device is.
"""

import numpy as np
import pytest

from ebsp_mpi.backend import cupy_status
from ebsp_mpi.nn import FactorSpace, build_model, rebuild_gradient, stack_factors
from ebsp_mpi.nn.average import round_mean

BACKENDS = ["numpy", pytest.param("cupy", marks=pytest.mark.gpu)]
IN_SHAPE, CLASSES, HIDDEN, K = (1, 6, 5), 7, (24, 16), 8
SENTINEL = 123.0  # what dW holds before a backward with factors, and must still hold after it


def xp_of(name):
    if name == "numpy":
        return np
    cupy, reason = cupy_status()
    if cupy is None:
        pytest.skip(reason)
    return cupy


def host(a):
    return a.get() if hasattr(a, "get") and not isinstance(a, np.ndarray) else np.asarray(a)


def mlp(xp, seed=3):
    return build_model("mlp", IN_SHAPE, CLASSES, hidden=HIDDEN, xp=xp, seed=seed)


def batch(xp, seed, n=K):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n,) + IN_SHAPE).astype(np.float32)
    return xp.asarray(x), xp.asarray(rng.integers(0, CLASSES, size=n))


def dense_grad(model, x, y):
    """``(loss, host copy of space.grad)`` of a backward without factors."""
    loss = model.loss_and_grad(x, y)
    return loss, host(model.space.grad).copy()


def close(actual, expected):
    """float32 agreement, relative to the gradient's scale (BLAS sums in another order)."""
    actual, expected = host(actual), host(expected)
    np.testing.assert_allclose(actual, expected, rtol=1e-5, atol=1e-5 * float(np.abs(expected).max()))


def test_layout_is_v_then_u_per_layer_back_to_back():
    space = FactorSpace([("a.W", 3, 4), ("b.W", 5, 2)], batch=6)
    a, b = space.blocks
    assert (a.offset, a.v_offset, a.v_size, a.u_offset, a.u_size, a.size) == (0, 0, 18, 18, 24, 42)
    assert (b.offset, b.v_offset, b.u_offset, b.size) == (42, 42, 72, 42)
    assert space.size == 84 and space.nbytes == 84 * 4 and space.data.dtype == np.float32
    assert space.names == ("a.W", "b.W") and "b.W" in space and "c.W" not in space
    for name in space.names:
        v, u = space.V(name), space.U(name)
        assert v.shape == (6, space.block(name).d_in) and u.shape == (6, space.block(name).d_out)
        assert v.flags.c_contiguous and u.flags.c_contiguous
        assert np.shares_memory(v, space.data) and np.shares_memory(space.block_data(name), u)
    space.U("b.W")[...] = 1
    assert space.data[72:].sum() == 12 and space.data[:72].sum() == 0
    gathered = space.gathered(3)
    assert gathered.batch == 18 and gathered.size == 3 * space.size and gathered.layers() == space.layers()
    with pytest.raises(KeyError, match="known"):
        space.V("c.W")
    with pytest.raises(ValueError, match="duplicate"):
        FactorSpace([("a.W", 3, 4), ("a.W", 3, 4)], batch=2)
    with pytest.raises(ValueError, match="batch"):
        FactorSpace([("a.W", 3, 4)], batch=0)


@pytest.mark.parametrize("backend", BACKENDS)
def test_one_workers_factors_rebuild_its_dense_gradient(backend):
    xp = xp_of(backend)
    model = mlp(xp)
    x, y = batch(xp, seed=0)
    loss_ref, ref = dense_grad(model, x, y)

    factors = FactorSpace(model.factor_layers(), K, xp=xp)
    model.space.grad.fill(SENTINEL)
    loss = model.loss_and_grad(x, y, factors=factors)
    assert loss == loss_ref
    grad = host(model.space.grad)
    for name, d_in, d_out in model.factor_layers():
        v = model.space.view(name)
        out = xp.empty((d_in, d_out), dtype=xp.float32)
        assert rebuild_gradient(factors.V(name), factors.U(name), out) is out
        close(out, ref[v.offset:v.offset + v.size].reshape(v.shape))
        # dW is left as it was: the layer's weight gradient leaves as factors only.
        assert np.all(grad[v.offset:v.offset + v.size] == SENTINEL)
    for v in model.space.tensors:
        if v.name not in factors:
            np.testing.assert_array_equal(grad[v.offset:v.offset + v.size], ref[v.offset:v.offset + v.size])


@pytest.mark.parametrize("backend", BACKENDS)
def test_mean_over_three_workers_factors_equals_mean_of_their_dense_gradients(backend):
    xp, workers = xp_of(backend), 3
    model = mlp(xp)
    factors = FactorSpace(model.factor_layers(), K, xp=xp)
    recv = xp.empty((workers, factors.size), dtype=xp.float32)   # as an allgather of the whole buffer
    gathered = factors.gathered(workers)                            # as per-factor allgathers
    dense = []
    for p in range(workers):
        x, y = batch(xp, seed=10 + p)
        dense.append(xp.asarray(dense_grad(model, x, y)[1]))
        model.loss_and_grad(x, y, factors=factors)
        recv[p] = factors.data
        for name in factors.names:
            gathered.V(name)[p * K:(p + 1) * K] = factors.V(name)
            gathered.U(name)[p * K:(p + 1) * K] = factors.U(name)
    mean = host(round_mean(dense, xp.empty_like(dense[0])))

    stacked = factors.gathered(workers)
    for name, d_in, d_out in model.factor_layers():
        v_all, u_all = stack_factors(recv, factors, name, out=stacked)
        np.testing.assert_array_equal(host(v_all), host(gathered.V(name)))
        np.testing.assert_array_equal(host(u_all), host(gathered.U(name)))
        out = xp.empty((d_in, d_out), dtype=xp.float32)
        rebuild_gradient(gathered.V(name), gathered.U(name), out, scale=1.0 / workers)
        v = model.space.view(name)
        close(out, mean[v.offset:v.offset + v.size].reshape(v.shape))


@pytest.mark.parametrize("backend", BACKENDS)
def test_factors_ready_once_per_layer_last_first_and_final(backend):
    xp = xp_of(backend)
    model = mlp(xp)
    x, y = batch(xp, seed=1)
    factors = FactorSpace(model.factor_layers(), K, xp=xp)
    factors.data.fill(np.nan)
    seen, grads = [], []

    def on_factors_ready(name):
        seen.append((name, host(factors.block_data(name)).copy()))

    model.loss_and_grad(x, y, on_grad_ready=lambda name, stop: grads.append(name), factors=factors,
                        on_factors_ready=on_factors_ready)
    assert [name for name, _ in seen] == list(reversed(factors.names))
    for name, block in seen:
        assert np.isfinite(block).all()
        np.testing.assert_array_equal(block, host(factors.block_data(name)))
    # Biases still go through the gradient buffer; the SFB weights are not reported there.
    assert grads == [n for n in reversed([v.name for v in model.space.tensors]) if n not in factors]


@pytest.mark.parametrize("backend", BACKENDS)
def test_layers_outside_the_factor_space_behave_as_without_it(backend):
    xp = xp_of(backend)
    model = mlp(xp)
    x, y = batch(xp, seed=2)
    plain = []
    model.loss_and_grad(x, y, on_grad_ready=lambda n, s: plain.append((n, s)), block_elems=64)
    ref = host(model.space.grad).copy()

    last = model.factor_layers()[-1]
    factors = FactorSpace([last], K, xp=xp)
    calls = []
    model.loss_and_grad(x, y, on_grad_ready=lambda n, s: calls.append((n, s)), block_elems=64,
                        factors=factors)
    # The row-blocked reports of the other dense layers are unchanged; only the SFB weight's are gone.
    assert calls == [c for c in plain if c[0] != last[0]]
    assert any(n == "dense1.W" and s < model.space.view("dense1.W").size for n, s in calls)
    grad = host(model.space.grad)
    for v in model.space.tensors:
        if v.name != last[0]:
            np.testing.assert_array_equal(grad[v.offset:v.offset + v.size], ref[v.offset:v.offset + v.size])


def test_a_wrong_batch_or_layer_is_a_clear_error():
    model = mlp(np)
    x, y = batch(np, seed=0, n=K + 1)
    with pytest.raises(ValueError, match=rf"batches of {K} samples, got a batch of {K + 1}"):
        model.loss_and_grad(x, y, factors=FactorSpace(model.factor_layers(), K))
    x, y = batch(np, seed=0)
    with pytest.raises(ValueError, match="not the W of a dense layer"):
        model.loss_and_grad(x, y, factors=FactorSpace([("dense1.b", 24, 1)], K))
    with pytest.raises(ValueError, match="the model's W is"):
        model.loss_and_grad(x, y, factors=FactorSpace([("dense1.W", 24, 16)], K))


def test_rebuild_checks_shapes_and_scales_in_place():
    rng = np.random.default_rng(4)
    v, u = rng.normal(size=(6, 3)).astype(np.float32), rng.normal(size=(6, 2)).astype(np.float32)
    out = np.empty((3, 2), dtype=np.float32)
    rebuild_gradient(v, u, out, scale=0.5)
    close(out, 0.5 * v.T.astype(np.float64) @ u)
    with pytest.raises(ValueError, match="out has shape"):
        rebuild_gradient(v, u, np.empty((2, 3), dtype=np.float32))
    with pytest.raises(ValueError, match="factors of shapes"):
        rebuild_gradient(v, u[:5], out)


def test_stack_factors_of_one_worker_are_views_and_more_need_a_gathered_space():
    space = FactorSpace([("a.W", 3, 4), ("b.W", 5, 2)], batch=2)
    recv = np.arange(2 * space.size, dtype=np.float32)
    v, u = stack_factors(recv[:space.size], space, "b.W")
    assert np.shares_memory(v, recv) and v.shape == (2, 5) and u.shape == (2, 2)
    with pytest.raises(ValueError, match="gathered"):
        stack_factors(recv, space, "b.W")
    v, u = stack_factors(recv, space, "b.W", out=space.gathered(2))
    b = space.block("b.W")
    expected = np.concatenate([recv[p * space.size + b.v_offset:][:b.v_size] for p in range(2)])
    np.testing.assert_array_equal(v.ravel(), expected)
