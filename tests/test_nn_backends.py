"""The same network code on every array backend: NumPy here, CuPy where a GPU is (marker ``gpu``).

Each body runs with ``xp = numpy`` everywhere and again with ``xp = cupy`` on a machine with CuPy and a
CUDA device; elsewhere the CuPy case is skipped. The checks: central-difference gradients of sampled
parameters (float64) through the backend's own arrays, agreement with the NumPy model, and a few SGD
steps that lower the loss.
"""

import numpy as np
import pytest

from ebsp_mpi.backend import cupy_status
from ebsp_mpi.nn import SGD, build_model


def _cupy():
    cupy, reason = cupy_status()
    if cupy is None:
        pytest.skip(reason)
    return cupy


BACKENDS = ["numpy", pytest.param("cupy", marks=pytest.mark.gpu)]
MODELS = [("mlp", (1, 8, 8)), ("cnn", (1, 8, 8))]


def xp_of(name):
    return np if name == "numpy" else _cupy()


def batch(in_shape, n=6, classes=4, seed=0):
    rng = np.random.default_rng(seed)
    return rng.normal(size=(n,) + in_shape), rng.integers(0, classes, size=n)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("kind, in_shape", MODELS)
def test_sampled_gradients_match_central_differences(backend, kind, in_shape):
    xp = xp_of(backend)
    model = build_model(kind, in_shape, 4, hidden=(16,), channels=(3, 4), xp=xp, dtype=np.float64, seed=1)
    x, y = batch(in_shape)
    xd, yd = xp.asarray(x), xp.asarray(y)
    model.loss_and_grad(xd, yd)
    grad = np.asarray(model.space.grad.get() if backend == "cupy" else model.space.grad).copy()
    data = model.space.data
    picks = np.random.default_rng(2).choice(model.space.size, size=40, replace=False)
    eps, numeric = 1e-6, []
    for i in picks:
        old = float(data[int(i)])
        data[int(i)] = old + eps
        up = model.loss_and_grad(xd, yd)
        data[int(i)] = old - eps
        down = model.loss_and_grad(xd, yd)
        data[int(i)] = old
        numeric.append((up - down) / (2 * eps))
    numeric, analytic = np.array(numeric), grad[picks]
    err = np.linalg.norm(numeric - analytic) / max(np.linalg.norm(numeric) + np.linalg.norm(analytic), 1e-300)
    assert err <= 1e-6


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("kind, in_shape", MODELS)
def test_backend_agrees_with_numpy_and_sgd_lowers_the_loss(backend, kind, in_shape):
    xp = xp_of(backend)
    x, y = batch(in_shape, n=32, seed=3)
    ref = build_model(kind, in_shape, 4, hidden=(16,), channels=(3, 4), dtype=np.float64, seed=5)
    model = build_model(kind, in_shape, 4, hidden=(16,), channels=(3, 4), xp=xp, dtype=np.float64, seed=5)
    loss_ref = ref.loss_and_grad(x, y)
    loss = model.loss_and_grad(xp.asarray(x), xp.asarray(y))
    grad = model.space.grad.get() if backend == "cupy" else model.space.grad
    assert loss == pytest.approx(loss_ref, rel=1e-12)
    np.testing.assert_allclose(grad, ref.space.grad, rtol=1e-9, atol=1e-12)

    opt = SGD(model.space.size, momentum=0.9, weight_decay=1e-4, xp=xp, dtype=np.float64)
    first = loss
    for _ in range(20):
        loss = model.loss_and_grad(xp.asarray(x), xp.asarray(y))
        opt.step(model.space.data, model.space.grad, 0.05)
    assert loss < 0.7 * first
