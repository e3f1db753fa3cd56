"""model.kind = 'cnn1d', MNIST-1D's CNN as Conv2D with kernels of height 1: its shapes and parameter
count against the paper's ConvBase, its forward pass against a plain 1-D convolution, its gradients."""

import numpy as np
import pytest

from cliutil import one_line_error
from ebsp_mpi.nn import Conv2D, build_model
from test_nn_gradcheck import check_model

MNIST1D = (1, 1, 40)


def test_mnist1d_cnn_has_the_papers_shapes_and_parameter_count():
    model = build_model("cnn1d", MNIST1D, 10, channels=(25, 25, 25), kernels=(5, 3, 3))
    convs = [layer for layer in model.layers if isinstance(layer, Conv2D)]
    # lengths 40 -> 19 -> 10 -> 5 as PyTorch's Conv1d(k, stride=2, padding=1) gives; 25 * 5 = 125 features
    assert [c.out_hw for c in convs] == [(1, 19), (1, 10), (1, 5)]
    shapes = {t.name: t.shape for t in model.space.tensors}
    assert shapes["conv1.W"] == (25, 1, 1, 5) and shapes["conv3.W"] == (25, 25, 1, 3)
    assert shapes["dense1.W"] == (125, 10)
    # ConvBase(channels=25, linear_in=125): 150 + 1900 + 1900 + 1260
    assert model.space.size == 5210


def conv1d(x, w, b, stride=2, padding=1):
    """A plain 1-D cross-correlation, (N, C, L) with (O, C, k) weights."""
    x = np.pad(x, ((0, 0), (0, 0), (padding, padding)))
    k = w.shape[-1]
    out = (x.shape[-1] - k) // stride + 1
    y = np.empty((x.shape[0], w.shape[0], out))
    for i in range(out):
        window = x[:, :, i * stride:i * stride + k]
        y[:, :, i] = np.einsum("nck,ock->no", window, w) + b
    return y


def test_forward_is_a_strided_padded_1d_convolution():
    model = build_model("cnn1d", (2, 1, 13), 3, channels=(4, 3), kernels=(5, 3), dtype=np.float64, seed=3)
    model.space.data[...] += np.random.default_rng(1).normal(scale=0.1, size=model.space.size)
    x = np.random.default_rng(2).normal(size=(3, 2, 1, 13))
    h = x[:, :, 0]
    for k in (1, 2):
        w, b = model.space.param(f"conv{k}.W")[:, :, 0], model.space.param(f"conv{k}.b")
        h = np.maximum(conv1d(h, w, b), 0.0)
    logits = h.reshape(3, -1) @ model.space.param("dense1.W") + model.space.param("dense1.b")
    np.testing.assert_allclose(model.forward(x), logits, rtol=1e-12, atol=1e-12)


def test_cnn1d_gradcheck():
    model = build_model("cnn1d", (2, 1, 11), 3, channels=(3, 2, 2), kernels=(5, 3), dtype=np.float64, seed=2)
    rng = np.random.default_rng(4)
    check_model(model, rng.normal(size=(2, 2, 1, 11)), np.array([2, 0]))


def test_cnn1d_needs_three_axes():
    with pytest.raises(ValueError, match="cnn1d' needs in_shape"):
        build_model("cnn1d", (40,), 10)


def test_a_kernel_wider_than_the_sequence_is_one_line(capsys):
    line = one_line_error(capsys, ["train", "--set", "model.kind=cnn1d", "--set", "model.kernels=[50]",
                                   "--set", "stop.iterations=1"])
    assert "model.kind = 'cnn1d'" in line and "(1, 50)" in line and "does not fit" in line
