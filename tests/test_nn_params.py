"""ParamSpace: one flat buffer of named views, deterministic init, state dicts."""

import numpy as np
import pytest

from ebsp_mpi.nn import ParamSpace, TensorSpec, build_model

SPECS = [
    TensorSpec("conv1.W", (4, 3, 3, 3), "he_normal", 27, 36),
    TensorSpec("conv1.b", (4,), "zeros", 27, 36),
    TensorSpec("dense1.W", (16, 5), "glorot_uniform", 16, 5),
    TensorSpec("dense1.b", (5,), "zeros", 16, 5),
]


def test_layout_is_contiguous_in_forward_order():
    space = ParamSpace(SPECS)
    assert [v.name for v in space.tensors] == [s.name for s in SPECS]
    offset = 0
    for v, s in zip(space.tensors, SPECS, strict=True):
        assert (v.offset, v.size, v.shape) == (offset, int(np.prod(s.shape)), s.shape)
        offset += v.size
    assert space.size == offset == 108 + 4 + 80 + 5
    assert space.nbytes == space.size * 4
    assert space.data.shape == space.grad.shape == (space.size,)
    assert space.data.dtype == space.grad.dtype == np.float32
    assert space.data.flags.c_contiguous and space.grad.flags.c_contiguous
    assert ParamSpace(SPECS, dtype=np.float64).nbytes == space.size * 8


def test_views_alias_the_buffers():
    space = ParamSpace(SPECS)
    w = space.param("dense1.W")
    assert w.shape == (16, 5) and np.shares_memory(w, space.data)
    w[2, 3] = 7.0
    assert space.data[space.view("dense1.W").offset + 2 * 5 + 3] == 7.0
    space.data[space.view("conv1.b").offset + 1] = -3.0
    assert space.param("conv1.b")[1] == -3.0
    g = space.grad_of("conv1.W")
    g[...] = 1.0
    assert space.grad[:108].sum() == 108 and space.grad[108:].sum() == 0
    space.zero_grad()
    assert not space.grad.any()


def test_unknown_tensor_name_is_named():
    with pytest.raises(KeyError, match="nope"):
        ParamSpace(SPECS).param("nope")


def test_init_is_deterministic_and_seed_dependent():
    a, b, c = ParamSpace(SPECS), ParamSpace(SPECS), ParamSpace(SPECS)
    a.init(3), b.init(3), c.init(4)
    np.testing.assert_array_equal(a.data, b.data)
    assert not np.array_equal(a.data, c.data)
    assert not a.param("conv1.b").any() and not a.param("dense1.b").any()
    lim = np.sqrt(6 / (16 + 5))
    assert np.abs(a.param("dense1.W")).max() <= lim
    # float32 and float64 spaces get the same draws (host float64, then cast).
    d = ParamSpace(SPECS, dtype=np.float64)
    d.init(3)
    np.testing.assert_array_equal(a.data, d.data.astype(np.float32))


def test_init_scales():
    big = [TensorSpec("w", (400, 300), "he_normal", 400, 300),
           TensorSpec("u", (400, 300), "glorot_uniform", 400, 300)]
    space = ParamSpace(big, dtype=np.float64)
    space.init(0)
    assert space.param("w").std() == pytest.approx(np.sqrt(2 / 400), rel=0.02)
    assert space.param("u").std() == pytest.approx(np.sqrt(6 / 700) / np.sqrt(3), rel=0.02)


def test_state_dict_round_trip_and_copies():
    a = ParamSpace(SPECS)
    a.init(1)
    sd = a.state_dict()
    assert list(sd) == [s.name for s in SPECS]
    assert all(isinstance(v, np.ndarray) and not np.shares_memory(v, a.data) for v in sd.values())
    sd["dense1.W"][0, 0] = 42.0
    assert a.param("dense1.W")[0, 0] != 42.0
    b = ParamSpace(SPECS)
    b.load_state_dict(sd)
    assert b.param("dense1.W")[0, 0] == 42.0
    np.testing.assert_array_equal(b.param("conv1.W"), a.param("conv1.W"))


def test_load_state_dict_errors_name_the_problem():
    space = ParamSpace(SPECS)
    sd = space.state_dict()
    missing = {k: v for k, v in sd.items() if k != "conv1.b"}
    with pytest.raises(ValueError, match=r"missing tensors \['conv1.b'\]"):
        space.load_state_dict(missing)
    with pytest.raises(ValueError, match=r"unexpected tensors \['extra'\]"):
        space.load_state_dict({**sd, "extra": np.zeros(1)})
    with pytest.raises(ValueError, match=r"'dense1.W' has shape \(5, 16\), expected \(16, 5\)"):
        space.load_state_dict({**sd, "dense1.W": np.zeros((5, 16))})


def test_spec_errors():
    with pytest.raises(ValueError, match="duplicate tensor name 'a'"):
        ParamSpace([TensorSpec("a", (2,), "zeros", 1, 1)] * 2)
    with pytest.raises(ValueError, match="init 'normal'"):
        TensorSpec("a", (2,), "normal", 1, 1)


def test_model_parameters_live_in_the_space():
    model = build_model("cnn", (1, 8, 8), 10, seed=5)
    names = [v.name for v in model.space.tensors]
    assert names == ["conv1.W", "conv1.b", "conv2.W", "conv2.b",
                     "dense1.W", "dense1.b", "dense2.W", "dense2.b"]
    other = build_model("cnn", (1, 8, 8), 10, seed=5)
    np.testing.assert_array_equal(model.space.data, other.space.data)
    x = np.random.default_rng(0).normal(size=(2, 1, 8, 8))
    before = model.forward(x)
    model.space.param("dense2.b")[...] += 1.0     # a write through a view changes the model
    np.testing.assert_allclose(model.forward(x), before + 1.0, rtol=1e-5)
