"""Finite-difference gradient checks (float64) of every layer, the loss and both models, plus the
forward passes of Conv2D and MaxPool2D against naive loops."""

import numpy as np
import pytest

from ebsp_mpi.nn import (Conv2D, Dense, Flatten, MaxPool2D, Model, ParamSpace, ReLU, build_model,
                         softmax_cross_entropy)
from ebsp_mpi.nn.layers import row_blocks

EPS = 1e-6
TOL = 1e-6


def rel_err(a, b):
    a, b = np.ravel(a), np.ravel(b)
    return np.linalg.norm(a - b) / max(np.linalg.norm(a) + np.linalg.norm(b), 1e-300)


def numeric_grad(f, arr):
    """Central differences of the scalar f() w.r.t. every element of arr (perturbed in place)."""
    g = np.zeros(arr.shape)
    flat, gflat = arr.reshape(-1), g.reshape(-1)
    assert np.shares_memory(flat, arr)
    for i in range(flat.size):
        old = flat[i]
        flat[i] = old + EPS
        fp = f()
        flat[i] = old - EPS
        fm = f()
        flat[i] = old
        gflat[i] = (fp - fm) / (2 * EPS)
    return g


def bound_layer(layer, in_shape, seed=0):
    specs, out_shape = layer.build(in_shape, "l1")
    space = ParamSpace(specs, dtype=np.float64)
    layer.bind(space)
    space.init(seed)
    # Non-zero biases so their gradients and effects are exercised too.
    space.data[...] = np.random.default_rng(seed + 1).normal(size=space.size)
    return space, out_shape


def check_layer(layer, in_shape, batch=2, seed=0):
    """Gradient check of a layer on the scalar sum(forward(x) * R): input and all parameters."""
    space, out_shape = bound_layer(layer, in_shape, seed)
    rng = np.random.default_rng(seed + 2)
    x = rng.normal(size=(batch,) + tuple(in_shape))
    r = rng.normal(size=(batch,) + tuple(out_shape))

    def f():
        return float(np.sum(layer.forward(x, train=False) * r))

    y = layer.forward(x, train=True)
    assert y.shape == (batch,) + tuple(out_shape)
    space.grad[...] = np.nan
    dx = layer.backward(r)
    assert dx.shape == x.shape
    errs = {"input": rel_err(dx, numeric_grad(f, x))}
    for name in layer.tensor_names:
        errs[name] = rel_err(space.grad_of(name), numeric_grad(f, space.param(name)))
    assert np.all(np.isfinite(space.grad)), "backward left gradient elements unwritten"
    for what, err in errs.items():
        assert err <= TOL, f"{what}: relative error {err:.2e}"
    return space


def test_dense_gradcheck():
    check_layer(Dense(4), (5,), batch=3)


def test_relu_gradcheck():
    check_layer(ReLU(), (3, 4), batch=2)


def test_flatten_gradcheck():
    check_layer(Flatten(), (2, 3, 2), batch=2)


@pytest.mark.parametrize("stride,padding,kernel", [
    (1, 0, 3), (1, 1, 3), (2, 0, 3), (2, 1, 3), ((2, 1), (0, 1), (2, 3)),
    (1, 2, 3), (1, 3, 3), (1, (2, 1), (3, 2)), (1, 0, 1),
])
def test_conv2d_gradcheck(stride, padding, kernel):
    check_layer(Conv2D(3, kernel, stride=stride, padding=padding), (2, 6, 5), batch=2)


@pytest.mark.parametrize("size,stride,hw",
                         [(2, None, (4, 6)), (2, None, (5, 5)), (3, 2, (7, 6)), (2, 1, (4, 4))])
def test_maxpool_gradcheck(size, stride, hw):
    check_layer(MaxPool2D(size, stride), (2,) + hw, batch=2)


def test_backward_overwrites_param_grads():
    layer = Conv2D(2, 3, padding=1)
    space, out_shape = bound_layer(layer, (2, 4, 4))
    rng = np.random.default_rng(3)
    x, r = rng.normal(size=(2, 2, 4, 4)), rng.normal(size=(2,) + out_shape)
    layer.forward(x, train=True)
    layer.backward(r)
    first = space.grad.copy()
    layer.forward(x, train=True)
    layer.backward(r)
    np.testing.assert_array_equal(space.grad, first)


def naive_conv(x, w, b, stride, padding):
    n, _, h, wd = x.shape
    o, _, kh, kw = w.shape
    xp = np.pad(x, ((0, 0), (0, 0), (padding, padding), (padding, padding)))
    ho, wo = (h + 2 * padding - kh) // stride + 1, (wd + 2 * padding - kw) // stride + 1
    y = np.zeros((n, o, ho, wo))
    for i in range(n):
        for k in range(o):
            for r in range(ho):
                for s in range(wo):
                    patch = xp[i, :, r * stride:r * stride + kh, s * stride:s * stride + kw]
                    y[i, k, r, s] = np.sum(patch * w[k]) + b[k]
    return y


@pytest.mark.parametrize("stride,padding", [(1, 0), (1, 1), (1, 2), (1, 3), (2, 0), (2, 1), (3, 2)])
def test_conv2d_forward_matches_naive(stride, padding):
    layer = Conv2D(4, 3, stride=stride, padding=padding)
    space, _ = bound_layer(layer, (3, 7, 8))
    x = np.random.default_rng(4).normal(size=(2, 3, 7, 8))
    want = naive_conv(x, space.param("l1.W"), space.param("l1.b"), stride, padding)
    np.testing.assert_allclose(layer.forward(x, train=False), want, rtol=1e-12, atol=1e-12)


def naive_maxpool(x, k, s):
    n, c, h, w = x.shape
    ho, wo = (h - k) // s + 1, (w - k) // s + 1
    y = np.zeros((n, c, ho, wo))
    for i in range(n):
        for j in range(c):
            for r in range(ho):
                for t in range(wo):
                    y[i, j, r, t] = x[i, j, r * s:r * s + k, t * s:t * s + k].max()
    return y


@pytest.mark.parametrize("k,s,hw", [(2, 2, (6, 6)), (2, 2, (5, 7)), (3, 2, (7, 7)), (3, 1, (5, 4))])
def test_maxpool_forward_matches_naive(k, s, hw):
    layer = MaxPool2D(k, s)
    bound_layer(layer, (3,) + hw)
    x = np.random.default_rng(5).normal(size=(2, 3) + hw)
    np.testing.assert_array_equal(layer.forward(x, train=False), naive_maxpool(x, k, s))


def test_maxpool_ties_send_gradient_to_first_maximum():
    layer = MaxPool2D(2)
    bound_layer(layer, (1, 2, 2))
    x = np.ones((1, 1, 2, 2))
    layer.forward(x, train=True)
    dx = layer.backward(np.full((1, 1, 1, 1), 5.0))
    np.testing.assert_array_equal(dx, [[[[5.0, 0.0], [0.0, 0.0]]]])


def test_maxpool_overlapping_ties_give_each_window_one_winner():
    layer = MaxPool2D(2, stride=1)
    bound_layer(layer, (1, 3, 3))
    layer.forward(np.ones((1, 1, 3, 3)), train=True)
    dx = layer.backward(np.ones((1, 1, 2, 2)))
    np.testing.assert_array_equal(dx[0, 0], [[1, 1, 0], [1, 1, 0], [0, 0, 0]])


def test_conv_evaluation_forward_between_training_forward_and_backward():
    layer = Conv2D(3, 3, padding=1)
    space, out_shape = bound_layer(layer, (2, 5, 5))
    rng = np.random.default_rng(13)
    x, other = rng.normal(size=(2, 2, 5, 5)), rng.normal(size=(4, 2, 5, 5))
    r = rng.normal(size=(2,) + out_shape)
    layer.forward(x, train=True)
    dx = layer.backward(r)
    want = space.grad.copy()
    layer.forward(x, train=True)
    layer.forward(other, train=False)
    np.testing.assert_array_equal(layer.backward(r), dx)
    np.testing.assert_array_equal(space.grad, want)


def test_softmax_cross_entropy_gradcheck_and_value():
    rng = np.random.default_rng(6)
    logits, labels = rng.normal(size=(4, 5)), np.array([0, 3, 4, 3])
    loss, d = softmax_cross_entropy(logits, labels)
    p = np.exp(logits) / np.exp(logits).sum(1, keepdims=True)
    assert loss == pytest.approx(-np.mean(np.log(p[np.arange(4), labels])), rel=1e-12)
    num = numeric_grad(lambda: softmax_cross_entropy(logits, labels)[0], logits)
    assert rel_err(d, num) <= TOL


def test_softmax_cross_entropy_is_stable_for_huge_logits():
    logits = np.array([[1e4, 0.0, -1e4], [0.0, 1e4, 1e4]])
    loss, d = softmax_cross_entropy(logits, np.array([0, 1]))
    assert loss == pytest.approx(np.log(2) / 2)
    np.testing.assert_allclose(d, [[0, 0, 0], [0, -0.25, 0.25]], atol=1e-12)


def check_model(model, x, y):
    space = model.space
    space.data[...] += np.random.default_rng(7).normal(scale=0.1, size=space.size)  # non-zero biases
    space.grad[...] = np.nan
    loss, dx = model.loss_and_input_grad(x, y)
    assert np.all(np.isfinite(space.grad))
    analytic = space.grad.copy()

    def f():
        return softmax_cross_entropy(model.forward(x), y)[0]

    assert loss == pytest.approx(f(), rel=1e-12)
    assert rel_err(dx, numeric_grad(f, x)) <= TOL
    assert rel_err(analytic, numeric_grad(f, space.data)) <= TOL
    for v in space.tensors:   # every tensor on its own too, so a small one cannot hide
        a = analytic[v.offset:v.offset + v.size]
        assert rel_err(a, numeric_grad(f, space.param(v.name))) <= TOL, v.name
    # loss_and_grad (no input gradient) fills the same parameter gradients.
    space.grad[...] = np.nan
    assert model.loss_and_grad(x, y) == pytest.approx(loss, rel=1e-15)
    np.testing.assert_allclose(space.grad, analytic, rtol=1e-12, atol=1e-15)


def test_mlp_gradcheck_with_image_input():
    model = build_model("mlp", (2, 3, 3), 4, hidden=(6, 5), dtype=np.float64, seed=1)
    rng = np.random.default_rng(8)
    check_model(model, rng.normal(size=(3, 2, 3, 3)), np.array([0, 3, 1]))


def test_cnn_gradcheck():
    model = build_model("cnn", (2, 6, 6), 4, hidden=(5,), channels=(2, 3), dtype=np.float64, seed=2)
    rng = np.random.default_rng(9)
    check_model(model, rng.normal(size=(2, 2, 6, 6)), np.array([1, 2]))


def test_on_grad_ready_reports_tensors_last_layer_first_after_their_grads():
    model = build_model("cnn", (1, 8, 8), 3, hidden=(4,), channels=(2, 2), dtype=np.float64)
    model.space.grad[...] = np.nan
    seen = []

    def ready(name, stop):
        assert np.all(np.isfinite(model.space.grad_of(name).reshape(-1)[:stop]))
        seen.append((name, stop))

    x = np.random.default_rng(10).normal(size=(2, 1, 8, 8))
    model.loss_and_grad(x, np.array([0, 2]), on_grad_ready=ready)
    size = {t.name: t.size for t in model.space.tensors}
    assert seen == [(n, size[n]) for n in ("dense2.W", "dense2.b", "dense1.W", "dense1.b",
                                           "conv2.W", "conv2.b", "conv1.W", "conv1.b")]


def test_dense_weight_gradients_in_row_blocks_are_reported_in_order_and_equal_whole_ones():
    model = build_model("mlp", (10,), 3, hidden=(6,), dtype=np.float64)
    rng = np.random.default_rng(11)
    x, y = rng.normal(size=(5, 10)), np.array([0, 1, 2, 1, 0])
    model.loss_and_grad(x, y)
    whole = model.space.grad.copy()
    model.space.grad[...] = np.nan
    seen = []

    def ready(name, stop):
        assert np.all(np.isfinite(model.space.grad_of(name).reshape(-1)[:stop]))
        seen.append((name, stop))

    model.loss_and_grad(x, y, on_grad_ready=ready, block_elems=20)  # dense1.W is 10 x 6: blocks of 6, 3, 1 rows
    assert seen == [("dense2.W", 18), ("dense2.b", 3),
                    ("dense1.W", 36), ("dense1.W", 54), ("dense1.W", 60), ("dense1.W", 60),
                    ("dense1.b", 6)]
    np.testing.assert_allclose(model.space.grad, whole, rtol=1e-12, atol=1e-15)


@pytest.mark.parametrize("n, rows, blocks", [
    (784, 128, [(0, 384), (384, 640), (640, 768), (768, 784)]),  # the benchmark MLP's first layer
    (1024, 512, [(0, 512), (512, 1024)]),
    (10, 3, [(0, 6), (6, 9), (9, 10)]),
    (8, 1, [(0, 5), (5, 7), (7, 8)]),
    (5, 5, [(0, 5)]),
])
def test_row_blocks_shrink_towards_the_end_and_cover_every_row(n, rows, blocks):
    assert row_blocks(n, rows) == blocks


def test_cnn_structure_skips_pool_below_two_pixels():
    model = build_model("cnn", (1, 8, 8), 10, channels=(2, 2, 2, 2))
    assert sum(isinstance(layer, MaxPool2D) for layer in model.layers) == 3
    assert sum(isinstance(layer, Conv2D) for layer in model.layers) == 4
    assert model.space.param("dense1.W").shape == (2, 128)
    assert model.forward(np.zeros((3, 1, 8, 8))).shape == (3, 10)


def test_float32_model_computes_in_float32():
    model = build_model("cnn", (1, 8, 8), 10)
    x = np.random.default_rng(11).normal(size=(4, 1, 8, 8))   # float64 input is cast
    assert model.forward(x).dtype == np.float32
    loss = model.loss_and_grad(x, np.arange(4))
    assert isinstance(loss, float) and np.isfinite(loss)
    assert model.space.grad.dtype == np.float32


def test_model_errors_are_clear():
    with pytest.raises(ValueError, match="allowed kinds: mlp, cnn"):
        build_model("resnet", (1, 8, 8), 10)
    with pytest.raises(ValueError, match=r"in_shape \(C, H, W\)"):
        build_model("cnn", (64,), 10)
    with pytest.raises(ValueError, match="Flatten"):
        Model([Dense(3)], (2, 2), 3)
    model = build_model("mlp", (4,), 3)
    with pytest.raises(ValueError, match=r"expected batches of shape \(N, 4\)"):
        model.forward(np.zeros((2, 5)))


def test_evaluate_batches_match_one_pass():
    model = build_model("mlp", (6,), 3, hidden=(8,), dtype=np.float64)
    rng = np.random.default_rng(12)
    x, y = rng.normal(size=(10, 6)), rng.integers(0, 3, size=10)
    logits = model.forward(x)
    loss, acc = model.evaluate(x, y, batch_size=3)
    assert loss == pytest.approx(softmax_cross_entropy(logits, y)[0], rel=1e-12)
    assert acc == pytest.approx(np.mean(logits.argmax(1) == y))
