"""SGD against a hand-written reference, learning-rate schedules, and a small training run."""

import math
import tracemalloc

import numpy as np
import pytest

from ebsp_mpi.nn import SGD, build_model, kernels, make_schedule
from ebsp_mpi.nn.average import round_mean

needs_numba = pytest.mark.skipif(not kernels.AVAILABLE, reason="needs numba")
FUSED = [False, pytest.param(True, marks=needs_numba)]


def reference_sgd(p, grads, lrs, mu, nesterov, wd):
    """Plain per-step PyTorch-convention SGD in float64."""
    p, v = p.copy(), np.zeros_like(p)
    for g, lr in zip(grads, lrs, strict=True):
        g = g + wd * p
        if mu:
            v = mu * v + g
            d = g + mu * v if nesterov else v
        else:
            d = g
        p = p - lr * d
    return p


@pytest.mark.parametrize("mu,nesterov,wd", [
    (0.0, False, 0.0), (0.0, False, 1e-2), (0.9, False, 0.0), (0.9, False, 5e-3),
    (0.9, True, 0.0), (0.8, True, 1e-2),
])
@pytest.mark.parametrize("size", [37, 70001])   # 70001 spans several CPU blocks
@pytest.mark.parametrize("fused", FUSED)
def test_sgd_matches_reference(mu, nesterov, wd, size, fused):
    rng = np.random.default_rng(0)
    p0 = rng.normal(size=size)
    grads = [rng.normal(size=size) for _ in range(4)]
    lrs = [0.1, 0.05, 0.2, 0.01]
    opt = SGD(size, momentum=mu, nesterov=nesterov, weight_decay=wd, dtype=np.float64, fused=fused)
    p = p0.copy()
    for g, lr in zip(grads, lrs, strict=True):
        g_before = g.copy()
        opt.step(p, g, lr)
        np.testing.assert_array_equal(g, g_before)      # grad is never modified
    want = reference_sgd(p0, grads, lrs, mu, nesterov, wd)
    np.testing.assert_allclose(p, want, rtol=1e-13, atol=1e-14)


@pytest.mark.parametrize("fused", FUSED)
def test_sgd_per_tensor_slices_equal_whole_buffer(fused):
    rng = np.random.default_rng(1)
    p0, grads = rng.normal(size=50), [rng.normal(size=50) for _ in range(3)]
    whole = SGD(50, momentum=0.9, nesterov=True, dtype=np.float64, fused=fused)
    sliced = SGD(50, momentum=0.9, nesterov=True, dtype=np.float64, fused=fused)
    a, b = p0.copy(), p0.copy()
    for g in grads:
        whole.step(a, g, 0.1)
        for lo, hi in [(30, 50), (0, 12), (12, 30)]:        # any order, as pushes may arrive
            sliced.step(b[lo:hi], g[lo:hi], 0.1, offset=lo)
    np.testing.assert_array_equal(a, b)
    np.testing.assert_array_equal(whole.velocity, sliced.velocity)


def test_sgd_float32_and_errors():
    opt = SGD(4, momentum=0.5)
    p = np.ones(4, dtype=np.float32)
    opt.step(p, np.ones(4, dtype=np.float32), 0.5)
    assert p.dtype == np.float32 and np.allclose(p, 0.5)
    with pytest.raises(ValueError, match="nesterov"):
        SGD(4, nesterov=True)
    with pytest.raises(ValueError, match="offset 2"):
        opt.step(p, p.copy(), 0.1, offset=2)
    with pytest.raises(ValueError, match=r"grad \(3,\)"):
        opt.step(p, np.ones(3, dtype=np.float32), 0.1)


@needs_numba
@pytest.mark.parametrize("mu,nesterov,wd", [
    (0.0, False, 0.0), (0.0, False, 5e-4), (0.9, False, 0.0), (0.9, False, 5e-4),
    (0.9, True, 0.0), (0.5, True, 1e-2),
])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_fused_step_is_bit_identical_to_numpy(mu, nesterov, wd, dtype):
    """The oracle and the server may take different paths; their parameters must agree to the bit."""
    rng = np.random.default_rng(2)
    size = 100_003
    p0 = rng.normal(size=size).astype(dtype)
    fused, numpy_path = (SGD(size, momentum=mu, nesterov=nesterov, weight_decay=wd, dtype=dtype, fused=f)
                         for f in (True, False))
    assert fused.fused and not numpy_path.fused
    a, b = p0.copy(), p0.copy()
    for lr in [0.1, 0.037, 0.2, 1e-3, 0.05]:
        g = (rng.normal(size=size) * rng.uniform(1e-4, 10)).astype(dtype)
        fused.step(a, g, lr)
        numpy_path.step(b, g, lr)
    assert np.array_equal(a.view(np.uint8), b.view(np.uint8))
    assert np.array_equal(fused.velocity.view(np.uint8), numpy_path.velocity.view(np.uint8))
    assert not np.array_equal(a, p0)


@needs_numba
@pytest.mark.parametrize("mu,nesterov,wd", [
    (0.0, False, 0.0), (0.0, False, 5e-4), (0.9, False, 0.0), (0.9, False, 5e-4),
    (0.9, True, 0.0), (0.5, True, 1e-2),
])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("k", [2, 3, 5])
def test_fused_round_step_is_bit_identical_to_round_mean_then_step(mu, nesterov, wd, dtype, k):
    """A BSP round's step with each element's mean formed in the loop (``SGD.step_mean``) gives the
    parameters of ``round_mean`` then ``step`` to the bit: the oracle takes the second way."""
    rng = np.random.default_rng(4)
    size = 100_003
    p0 = rng.normal(size=size).astype(dtype)
    fused, numpy_path = (SGD(size, momentum=mu, nesterov=nesterov, weight_decay=wd, dtype=dtype, fused=f)
                         for f in (True, False))
    a, b = p0.copy(), p0.copy()
    out = np.full(size, np.nan, dtype=dtype)
    for lr in [0.1, 0.037, 1e-3]:
        grads = [(rng.normal(size=size) * rng.uniform(1e-4, 10)).astype(dtype) for _ in range(k)]
        fused.step_mean(a, grads, lr, out=out)
        numpy_path.step(b, round_mean(grads, np.empty(size, dtype)), lr)
    assert np.isnan(out).all()  # the fused loop ran: it never forms the mean in a buffer
    assert np.array_equal(a.view(np.uint8), b.view(np.uint8))
    assert np.array_equal(fused.velocity.view(np.uint8), numpy_path.velocity.view(np.uint8))


@needs_numba
def test_round_step_on_gradients_the_loop_does_not_take_forms_the_mean_as_round_mean_does():
    rng = np.random.default_rng(5)
    p = rng.standard_normal(40).astype(np.float32)
    strided = np.repeat(rng.standard_normal(40).astype(np.float32), 2)[::2]
    grads = [rng.standard_normal(40).astype(np.float32), strided]
    expected = p.copy()
    reference = SGD(40, momentum=0.9, fused=False)
    fused = SGD(40, momentum=0.9, fused=True)
    reference.step(expected, round_mean(grads, np.empty(40, np.float32)), 0.5)
    out = np.empty(40, np.float32)
    fused.step_mean(p, grads, 0.5, out=out)
    assert np.array_equal(out, round_mean(grads, np.empty(40, np.float32)))
    assert np.array_equal(p, expected)


def _awkward_inputs(case: str):
    """Parameters and gradient that the compiled loops are not built for."""
    rng = np.random.default_rng(3)
    p = rng.standard_normal(20).astype(np.float32)
    g = rng.standard_normal(20).astype(np.float32)
    if case == "strided params":
        p = np.repeat(p, 2)[::2]
    elif case == "float64 grad":
        g = g.astype(np.float64)
    elif case == "read-only grad":
        g.flags.writeable = False
    return p, g


@needs_numba
@pytest.mark.parametrize("case", ["strided params", "float64 grad", "read-only grad"])
def test_fused_falls_back_where_it_does_not_fit(case):
    """Arrays the compiled loops are not built for take the NumPy path, with the NumPy path's result."""
    p, g = _awkward_inputs(case)
    expected = p.copy()
    reference = SGD(20, momentum=0.9, weight_decay=0.1, fused=False)
    fused = SGD(20, momentum=0.9, weight_decay=0.1, fused=True)
    for _ in range(2):
        reference.step(expected, g, 0.5)
        fused.step(p, g, 0.5)
    assert not np.array_equal(p, _awkward_inputs(case)[0])  # it did step
    assert np.array_equal(p, expected)
    assert np.array_equal(fused.velocity, reference.velocity)


@needs_numba
def test_fused_step_rejects_2d_arrays():
    opt = SGD(20, momentum=0.9, fused=True)
    with pytest.raises(ValueError, match="1-D"):
        opt.step(np.ones((4, 5), np.float32), np.ones((4, 5), np.float32), 0.5)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.filterwarnings("error")
def test_all_finite_finds_every_kind_of_non_finite(dtype):
    # NumPy raising on every floating-point error: a contiguous array's check (BLAS, no errstate guard)
    # must neither raise nor warn on the NaN products that are its answer
    with np.errstate(all="raise"):
        _finds_every_kind_of_non_finite(dtype)


def _finds_every_kind_of_non_finite(dtype):
    info = np.finfo(dtype)
    ok = np.array([0.0, -0.0, 1.0, -1.0, info.max, -info.max, info.tiny, info.smallest_subnormal],
                  dtype=dtype)
    assert kernels.all_finite(ok) and kernels.all_finite(ok[:0])
    assert kernels.all_finite(np.full(100_000, info.max, dtype=dtype))  # no product can overflow
    bits = np.uint32 if dtype == np.float32 else np.uint64
    exponent = np.finfo(dtype).nexp
    quiet, signalling = bits(0b11 << (np.finfo(dtype).nmant - 1)), bits(1)  # NaN payloads, besides np.nan's
    all_ones = bits(((1 << exponent) - 1) << np.finfo(dtype).nmant)
    payloads = [(all_ones | quiet).view(dtype), (all_ones | signalling).view(dtype)]
    for bad in (np.nan, -np.nan, np.inf, -np.inf, *payloads):
        for where in (0, 3, 1000, 4095):
            a = np.ones(4096, dtype=dtype)
            a[where] = bad
            assert not kernels.all_finite(a), (bad, where)
        # many blocks of zeros, and a partial one: a bad value in a whole block, in the rest, at a border
        big = np.ones(3 * kernels.CHECK_BLOCK + 5, dtype=dtype)
        for where in (kernels.CHECK_BLOCK - 1, kernels.CHECK_BLOCK, 2 * kernels.CHECK_BLOCK + 7, big.size - 1):
            big[where] = bad
            assert not kernels.all_finite(big), (bad, where)
            big[where] = 1.0
        assert kernels.all_finite(big)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_all_finite_allocates_nothing_the_size_of_its_array(dtype):
    # OSDP's peak (runtime/worker/peak.py, tracemalloc) counts whatever a worker allocates while it trains
    a = np.ones(1_000_000, dtype=dtype)
    tracemalloc.start()
    try:
        assert kernels.all_finite(a)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 4096, peak


@pytest.mark.parametrize("layout", ["strided", "2-D", "float16", "read-only"])
@pytest.mark.filterwarnings("error")
def test_all_finite_on_arrays_of_other_layouts(layout):
    a = np.ones(64, dtype=np.float16 if layout == "float16" else np.float32)
    view = {"strided": a[::2], "2-D": a.reshape(8, 8)}.get(layout, a)
    assert kernels.all_finite(view)
    a[10] = np.inf
    assert not kernels.all_finite(view)
    if layout == "read-only":
        a.flags.writeable = False
        assert not kernels.all_finite(a)


def test_constant_and_step_schedules():
    c = make_schedule("constant", 0.1)
    assert [c(s) for s in (0, 1, 10 ** 6)] == [0.1, 0.1, 0.1]
    s = make_schedule("step", 1.0, step_size=10, gamma=0.5)
    assert [s(0), s(9), s(10), s(25), s(30)] == [1.0, 1.0, 0.5, 0.25, 0.125]


def test_cosine_schedule():
    f = make_schedule("cosine", 1.0, total_steps=100, min_lr=0.1)
    assert f(0) == pytest.approx(1.0)
    assert f(50) == pytest.approx(0.55)
    assert f(25) == pytest.approx(0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi / 4)))
    assert f(100) == pytest.approx(0.1) and f(500) == pytest.approx(0.1)
    with pytest.raises(ValueError, match="total_steps"):
        make_schedule("cosine", 1.0)


def test_warmup_multiplies_any_kind():
    w = make_schedule("constant", 0.8, warmup_steps=4)
    assert [w(s) for s in range(6)] == pytest.approx([0.2, 0.4, 0.6, 0.8, 0.8, 0.8])
    ws = make_schedule("step", 1.0, warmup_steps=4, step_size=2, gamma=0.5)
    assert [ws(s) for s in range(5)] == pytest.approx([0.25, 0.5, 0.375, 0.5, 0.25])
    wc = make_schedule("cosine", 1.0, total_steps=10, warmup_steps=2)
    plain = make_schedule("cosine", 1.0, total_steps=10)
    assert wc(0) == pytest.approx(0.5 * plain(0)) and wc(1) == pytest.approx(plain(1))
    assert wc(5) == pytest.approx(plain(5)) and plain(5) < 1.0


def test_schedule_errors():
    with pytest.raises(ValueError, match="allowed: constant, step, cosine"):
        make_schedule("linear", 0.1)
    with pytest.raises(ValueError, match="step must be >= 0"):
        make_schedule("constant", 0.1)(-1)


def test_mlp_training_drives_loss_down():
    rng = np.random.default_rng(0)
    centers = rng.normal(scale=3.0, size=(3, 10))
    y = rng.integers(0, 3, size=600)
    x = (centers[y] + rng.normal(size=(600, 10))).astype(np.float32)
    model = build_model("mlp", (10,), 3, hidden=(16,), seed=0)
    opt = SGD(model.space.size, momentum=0.9)
    loss0, _ = model.evaluate(x, y)
    for _ in range(150):
        idx = rng.integers(0, 600, size=32)
        model.loss_and_grad(x[idx], y[idx])
        opt.step(model.space.data, model.space.grad, 0.05)
    loss, acc = model.evaluate(x, y)
    assert loss < 0.1 * loss0 and acc > 0.97


@pytest.mark.gpu
@pytest.mark.parametrize("mu, nesterov, wd", [(0.0, False, 0.0), (0.0, False, 5e-4), (0.9, False, 0.0),
                                              (0.9, True, 5e-4)])
def test_the_cupy_step_is_the_numpy_step_to_the_bit(mu, nesterov, wd):
    """One fused kernel on the GPU, without fused multiply-add: the NumPy path's parameters exactly,
    on a whole buffer and on a tensor's slice of it (``offset``)."""
    from ebsp_mpi.backend import cupy_status

    cupy, reason = cupy_status()
    if cupy is None:
        pytest.skip(reason)
    if not hasattr(cupy, "ElementwiseKernel"):
        pytest.skip("this CuPy compiles no kernels (the tests' stand-in)")
    rng = np.random.default_rng(3)
    p0 = rng.standard_normal(1000, dtype=np.float32)
    grads = [rng.standard_normal(1000, dtype=np.float32) for _ in range(5)]
    host = SGD(1000, momentum=mu, nesterov=nesterov, weight_decay=wd, fused=False)
    device = SGD(1000, momentum=mu, nesterov=nesterov, weight_decay=wd, xp=cupy)
    assert device._device_step is not None
    p, dp = p0.copy(), cupy.asarray(p0)
    for k, g in enumerate(grads):
        lr = 0.1 / (k + 1)
        host.step(p, g, lr)
        device.step(dp, cupy.asarray(g), lr)
        host.step(p[300:700], g[:400], lr, offset=300)
        device.step(dp[300:700], cupy.asarray(g[:400]), lr, offset=300)
    np.testing.assert_array_equal(dp.get(), p)
    np.testing.assert_array_equal(device.velocity.get(), host.velocity)


def test_the_fused_step_is_the_default_only_for_large_buffers():
    from ebsp_mpi.nn.optim import FUSED_MIN_SIZE

    assert not SGD(FUSED_MIN_SIZE - 1, momentum=0.9).fused
    assert SGD(FUSED_MIN_SIZE, momentum=0.9).fused is kernels.AVAILABLE


def test_training_the_digits_mlp_never_loads_numba(tmp_path):
    """Loading Numba costs every process about 1.7 s; the default job's model is too small to gain it
    back, and a NaN check alone never loads it."""
    import subprocess
    import sys

    code = ("import sys; from ebsp_mpi.cli import main; "
            "main(['train', '--set', 'stop.iterations=3', '--set', 'stop.epochs=0', '-q', "
            f"'--out', {str(tmp_path / 'run')!r}]); "
            "print('numba' in sys.modules)")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    assert p.stdout.split()[-1] == "False"
