"""The CUDA kernels of ``ebsp_mpi.nn.gpu_kernels`` against the layers' NumPy path, bit for bit.

Without a GPU: the module's exact CUDA source (``gpu_kernels.source(dtype)``, the text CuPy compiles)
is compiled with g++ under a small harness that defines ``__global__`` away and runs a launch as a
serial loop over every block and thread (the kernels use no shared memory and no synchronisation:
each thread writes only its own elements). :class:`EmulatedCupy` is NumPy plus a ``RawModule`` that
does that, so the LAYERS themselves take their kernel path (dispatch, argument order, buffers) and
are compared with the same layers on NumPy: outputs and gradients equal to the bit (NaN where NaN),
on float32 and float64, with ties, NaN, +-0 and +-Inf, overlapping pool windows, strided and
non-square convolutions, and views as inputs. Launches get at most 3 blocks, so the grid-stride
loops run several rounds. Skipped where g++ is missing.

On a machine with CuPy and a GPU (marker ``gpu``) the same comparisons run on the real kernels: the
pooling and the im2col/col2im steps exactly (the GEMMs around them differ between cuBLAS and BLAS).
"""

from __future__ import annotations

import atexit
import ctypes
import hashlib
import re
import shutil
import subprocess
import tempfile
import types
import warnings
from typing import ClassVar
from pathlib import Path

import numpy as np
import pytest

from ebsp_mpi.backend import cupy_status
from ebsp_mpi.nn import Conv2D, MaxPool2D, ParamSpace, gpu_kernels

DTYPES = [np.float32, np.float64]

# -- the emulated launch --------------------------------------------------------------------------------

PRELUDE = """
struct ebsp_dim3 { unsigned x, y, z; };
static ebsp_dim3 blockIdx, blockDim, threadIdx, gridDim;
#define __global__
"""

_LIBS: dict = {}
_BUILD_DIR: list = []     # made on the first compile, removed at exit


def _build_dir() -> Path:
    if not _BUILD_DIR:
        _BUILD_DIR.append(Path(tempfile.mkdtemp(prefix="ebsp_kernels_")))
        atexit.register(shutil.rmtree, _BUILD_DIR[0], ignore_errors=True)
    return _BUILD_DIR[0]


def _params(name):
    """(C type, argument name) of each parameter of kernel `name`."""
    out = []
    for part in gpu_kernels.KERNELS[name][0].split(","):
        m = re.fullmatch(r"\s*(.*?)\s*(\w+)\s*", part)
        out.append((m.group(1), m.group(2)))
    return out


def _launchers(code: str) -> str:
    text = []
    for name in gpu_kernels.KERNELS:
        if f"void {name}(" not in code:
            continue
        params = _params(name)
        decl = ", ".join(f"{t} {n}" for t, n in params)
        args = ", ".join(n for _, n in params)
        text.append(f"""
extern "C" void emu_{name}(unsigned grid, unsigned block, {decl}) {{
    gridDim.x = grid; gridDim.y = 1; gridDim.z = 1;
    blockDim.x = block; blockDim.y = 1; blockDim.z = 1;
    blockIdx.y = blockIdx.z = threadIdx.y = threadIdx.z = 0;
    for (unsigned b = 0; b < grid; ++b)
        for (unsigned t = 0; t < block; ++t) {{
            blockIdx.x = b; threadIdx.x = t;
            {name}({args});
        }}
}}""")
    return "\n".join(text)


def _compile(code: str):
    """The shared library of `code` (a module's CUDA source) with the emulating harness around it."""
    key = hashlib.sha256(code.encode()).hexdigest()[:16]
    lib = _LIBS.get(key)
    if lib is None:
        gxx = shutil.which("g++")
        if gxx is None:
            pytest.skip("g++ is not installed: the CUDA kernels cannot be emulated on the CPU")
        src, so = _build_dir() / f"k{key}.cpp", _build_dir() / f"k{key}.so"
        src.write_text(PRELUDE + code + _launchers(code) + "\n")
        # no contraction into fused multiply-adds, as the kernels are compiled (--fmad=false)
        subprocess.run([gxx, "-std=c++17", "-O2", "-ffp-contract=off", "-fPIC", "-shared",
                        "-Wall", "-Werror", "-o", str(so), str(src)], check=True,
                       capture_output=True, text=True)
        lib = _LIBS[key] = ctypes.CDLL(str(so))
    return lib


class _EmulatedModule:
    """``cupy.RawModule`` on the CPU: `code` compiled by g++, each launch run serially."""

    launches: ClassVar[list] = []

    def __init__(self, code, options=()):
        assert tuple(options) == gpu_kernels.OPTIONS
        self.code = code
        self.ctype = re.match(r"typedef (\w+) T;", code).group(1)
        self.lib = _compile(code)

    def get_function(self, name):
        fn = getattr(self.lib, f"emu_{name}")
        params = _params(name)
        want = np.dtype(np.float32 if self.ctype == "float" else np.float64)

        def launch(grid, block, args):
            assert len(args) == len(params), (name, len(args), len(params))
            cargs = []
            for (ctype, pname), a in zip(params, args, strict=True):
                if "*" in ctype:
                    assert isinstance(a, np.ndarray) and a.dtype == want, (name, pname)
                    if "const" not in ctype:
                        assert a.flags.writeable and a.flags.c_contiguous, (name, pname)
                    cargs.append(ctypes.c_void_p(a.ctypes.data))
                else:
                    assert type(a) is np.int32, (name, pname, type(a))
                    cargs.append(ctypes.c_int(int(a)))
            _EmulatedModule.launches.append(name)
            # at most 3 blocks: the grid-stride loops must cover the rest
            fn(ctypes.c_uint(min(grid[0], 3)), ctypes.c_uint(block[0]), *cargs)

        return launch


class EmulatedCupy(types.ModuleType):
    """NumPy with a ``RawModule`` that runs the kernels on the CPU: the layers take their CuPy path."""

    RawModule = _EmulatedModule

    def __init__(self):
        super().__init__("emulated_cupy")

    def __getattr__(self, name):
        return getattr(np, name)


EMU = EmulatedCupy()


def _cupy():
    cupy, reason = cupy_status()
    if cupy is None:
        pytest.skip(reason)
    return cupy


XPS = ["emulated", pytest.param("cupy", marks=pytest.mark.gpu)]


def _xp(name):
    if name == "emulated":
        _compile(gpu_kernels.source(np.float32))     # skips without g++
        return EMU
    return _cupy()


def _host(a):
    return a.get() if hasattr(a, "get") else np.asarray(a)


def _maximum_keeps_second() -> bool:
    """Whether NumPy's ``maximum`` (as MaxPool2D calls it: strided, ``out=``) returns its second
    operand on +0 against -0, as it does on x86-64 (the kernel does so). Where it does not (say a
    CPU whose max instruction returns +0 either way), the kernel cannot follow the sign of zero
    there, and the pooling test compares forward outputs with +-0 as equal."""
    x = np.zeros((2, 64), np.float32)
    x[0, 1::2] = -0.0
    x[1, 0::2] = -0.0
    y = x[:, 0::2].copy()
    np.maximum(y, x[:, 1::2], out=y)
    return bool(np.signbit(y[0]).all() and not np.signbit(y[1]).any())


MAXIMUM_KEEPS_SECOND = _maximum_keeps_second()


def assert_same_bits(got, want, what="", zero_sign=True):
    """Equal to the bit, +-0 told apart (unless not `zero_sign`); NaN where NaN (its payload aside:
    a GPU's differs)."""
    got, want = _host(got), np.asarray(want)
    assert got.shape == want.shape and got.dtype == want.dtype, what
    nan = np.isnan(want)
    np.testing.assert_array_equal(np.isnan(got), nan, err_msg=f"{what}: NaN positions differ")
    ints = np.uint32 if want.dtype == np.float32 else np.uint64
    if not zero_sign:
        got, want = got + 0, want + 0        # -0 + 0 is +0
    g, w = np.ascontiguousarray(got).view(ints), np.ascontiguousarray(want).view(ints)
    bad = (g != w) & ~nan
    assert not bad.any(), f"{what}: {bad.sum()} of {bad.size} elements differ, e.g. {got[bad][:5]} vs {want[bad][:5]}"


# -- inputs ----------------------------------------------------------------------------------------------

def _tricky(rng, shape, dtype, specials=True):
    """Small integers (many ties), with +-0, and where `specials` some NaN and +-Inf."""
    a = rng.integers(-3, 4, size=shape).astype(dtype)
    a[rng.random(shape) < 0.1] = -0.0
    if specials:
        u = rng.random(shape)
        a[u < 0.02] = np.nan
        a[(u >= 0.02) & (u < 0.03)] = np.inf
        a[(u >= 0.03) & (u < 0.04)] = -np.inf
    return a


def _smooth(rng, shape, dtype):
    return rng.standard_normal(shape).astype(dtype)


def _view(xp, a, kind):
    """`a` on the device as a contiguous array, or as a non-contiguous view of the same values."""
    d = xp.asarray(a)
    if kind == "contiguous":
        return d
    big = xp.zeros(a.shape[:3] + (2 * a.shape[3] + 1,), dtype=a.dtype)
    big[..., 1::2] = d
    return big[..., 1::2]


# -- MaxPool2D -------------------------------------------------------------------------------------------

POOLS = [(2, None), (3, 2), ((2, 3), (1, 2)), ((3, 2), (2, 3)), (2, (2, 1)), (1, 1), (3, 1)]


def _pool(xp, size, stride, in_shape):
    layer = MaxPool2D(size, stride)
    layer.build(in_shape, "p")
    layer.xp = xp
    return layer


@pytest.mark.parametrize("backend", XPS)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("size, stride", POOLS)
@pytest.mark.parametrize("layout", ["contiguous", "view"])
def test_maxpool_kernels_match_numpy_bit_for_bit(backend, dtype, size, stride, layout):
    xp = _xp(backend)
    rng = np.random.default_rng(7)
    in_shape = (3, 9, 11)
    x = _tricky(rng, (4,) + in_shape, dtype)
    ref, dev = _pool(np, size, stride, in_shape), _pool(xp, size, stride, in_shape)
    _EmulatedModule.launches.clear()
    y_ref = ref.forward(x, train=True)
    y = dev.forward(_view(xp, x, layout), train=True)
    assert_same_bits(y, y_ref, "forward", zero_sign=MAXIMUM_KEEPS_SECOND)
    fwd, bwd = "ebsp_maxpool_forward", "ebsp_maxpool_backward"
    # small integers sum exactly in any order; normal values show the order of the additions
    for kind in ("ints", "specials", "normal"):
        dy = (_smooth(rng, y_ref.shape, dtype) if kind == "normal"
              else _tricky(rng, y_ref.shape, dtype, specials=kind == "specials"))
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)     # inf * 0 in the NumPy path
            ref.forward(x, train=True)
            dx_ref = ref.backward(dy)
        dev.forward(_view(xp, x, layout), train=True)
        dx = dev.backward(_view(xp, dy, layout))
        assert_same_bits(dx, dx_ref, f"backward ({kind} dy)")
    if backend == "emulated":
        assert _EmulatedModule.launches == [fwd] + [fwd, bwd] * 3


def test_maxpool_tie_rule_and_unreached_elements():
    """The first offset (row-major) holding the maximum takes dy; NaN maxima send nothing; the last
    row and column, which no 2x2 window reaches on a 3x3 input, get 0."""
    xp = _xp("emulated")
    x = np.array([[[[1, 5, 9], [5, 2, 9], [9, 9, 9]]]], dtype=np.float64)
    x2 = np.array([[[[np.nan, 1, 0], [1, 1, 0], [0, 0, 0]]]])
    layer = _pool(xp, 2, None, (1, 3, 3))
    y = layer.forward(x, train=True)
    assert y.tolist() == [[[[5.0]]]]
    assert layer.backward(np.array([[[[3.0]]]])).tolist() == [[[[0, 3, 0], [0, 0, 0], [0, 0, 0]]]]
    y = layer.forward(x2, train=True)
    assert np.isnan(y).all()
    assert layer.backward(np.array([[[[3.0]]]])).tolist() == [[[[0, 0, 0]] * 3]]


# -- Conv2D ----------------------------------------------------------------------------------------------

CONVS = [  # kernel, stride, padding: wide (stride 1) layouts, then strided ones
    (3, 1, 1), ((2, 3), 1, (0, 1)), (3, 1, (1, 3)), (1, 1, 0),
    (3, 2, 1), ((3, 2), (2, 1), (1, 0)), (2, 3, 2),
]


def _conv(xp, dtype, kernel, stride, padding, in_shape, out=4):
    layer = Conv2D(out, kernel, stride=stride, padding=padding)
    specs, out_shape = layer.build(in_shape, "c")
    space = ParamSpace(specs, xp=xp, dtype=dtype)
    layer.bind(space)
    space.init(3)
    return layer, space, out_shape


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("kernel, stride, padding", CONVS)
@pytest.mark.parametrize("layout", ["contiguous", "view"])
def test_conv_layer_on_kernels_matches_numpy_bit_for_bit(dtype, kernel, stride, padding, layout):
    """Forward, input, weight and bias gradients of the whole layer (the emulated kernels around the
    same NumPy GEMMs): im2col and col2im change no bit."""
    xp = _xp("emulated")
    rng = np.random.default_rng(11)
    in_shape = (3, 7, 8)
    ref, ref_space, out_shape = _conv(np, dtype, kernel, stride, padding, in_shape)
    dev, dev_space, _ = _conv(xp, dtype, kernel, stride, padding, in_shape)
    _EmulatedModule.launches.clear()
    for step in range(2):            # the second step reuses the kept buffers
        x = _smooth(rng, (5,) + in_shape, dtype)
        dy = _smooth(rng, (5,) + out_shape, dtype)
        assert_same_bits(dev.forward(_view(xp, x, layout), train=True), ref.forward(x, train=True), "y")
        dx = dev.backward(_view(xp, dy, layout))
        dx_ref = ref.backward(dy)
        assert_same_bits(dx, dx_ref, f"dx, step {step}")
        assert_same_bits(dev_space.grad, ref_space.grad, f"dW, db, step {step}")
    wide = dev.wide
    assert _EmulatedModule.launches == ["ebsp_im2col_wide" if wide else "ebsp_im2col_strided",
                                        "ebsp_col2im_wide" if wide else "ebsp_col2im_strided"] * 2


@pytest.mark.gpu
@pytest.mark.parametrize("kernel, stride, padding", CONVS)
def test_conv_layer_on_cupy_agrees_with_numpy(kernel, stride, padding):
    """The whole layer on real CuPy (its GEMMs are cuBLAS's: close, not equal), float64."""
    xp = _xp("cupy")
    rng = np.random.default_rng(19)
    in_shape = (3, 7, 8)
    ref, ref_space, out_shape = _conv(np, np.float64, kernel, stride, padding, in_shape)
    dev, dev_space, _ = _conv(xp, np.float64, kernel, stride, padding, in_shape)
    for layout in ("contiguous", "view"):
        x = _smooth(rng, (5,) + in_shape, np.float64)
        dy = _smooth(rng, (5,) + out_shape, np.float64)
        np.testing.assert_allclose(_host(dev.forward(_view(xp, x, layout), train=True)),
                                   ref.forward(x, train=True), rtol=1e-12, atol=1e-12)
        np.testing.assert_allclose(_host(dev.backward(_view(xp, dy, layout))), ref.backward(dy),
                                   rtol=1e-12, atol=1e-12)
        np.testing.assert_allclose(_host(dev_space.grad), ref_space.grad, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("backend", XPS)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("kernel, stride, padding", CONVS)
def test_col2im_and_im2col_kernels_match_numpy_bit_for_bit(backend, dtype, kernel, stride, padding):
    """col2im adding onto a buffer that holds values (OSDP slices add slice after slice), with NaN,
    +-Inf and +-0 among the column gradients, and im2col's columns, on the same inputs."""
    xp = _xp(backend)
    rng = np.random.default_rng(5)
    in_shape = (3, 7, 8)
    n = 4
    ref, _, _ = _conv(np, dtype, kernel, stride, padding, in_shape)
    dev, _, _ = _conv(xp, dtype, kernel, stride, padding, in_shape)
    x = _smooth(rng, (n,) + in_shape, dtype)
    cols_ref = ref._columns(x, keep=False)
    cols = dev._columns(xp.asarray(x), keep=False)
    assert_same_bits(cols, cols_ref, "im2col")
    dcols = _tricky(rng, cols_ref.shape, dtype) * _smooth(rng, cols_ref.shape, dtype)
    buf0 = _smooth(rng, (n, in_shape[0], ref.plane), dtype)
    buf_ref, buf = buf0.copy(), xp.asarray(buf0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)     # inf + -inf in the NumPy path
        ref._col2im_add(dcols, buf_ref)
    dev._col2im_add(xp.asarray(dcols), buf)
    assert_same_bits(buf, buf_ref, "col2im onto values")
    # onto zero: the kernel writes every element of an uninitialised buffer
    buf_ref = ref._input_grad(n)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        ref._col2im_add(dcols, buf_ref, onto_zero=True)
    buf = xp.full((n, in_shape[0], dev.plane), np.nan, dtype=dtype)
    dev._col2im_add(xp.asarray(dcols), buf, onto_zero=True)
    assert_same_bits(buf, buf_ref, "col2im onto zero")


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("kernel, stride, padding", [(3, 1, 1), (3, 2, 1)])
def test_conv_slices_on_kernels_match_numpy(dtype, kernel, stride, padding):
    """OSDP's slice by slice forward and backward: the first col2im writes onto zero, the others add."""
    xp = _xp("emulated")
    rng = np.random.default_rng(13)
    in_shape, o = (3, 6, 7), 6
    x = _smooth(rng, (4,) + in_shape, dtype)
    results = []
    for mod in (np, xp):
        layer, space, out_shape = _conv(mod, dtype, kernel, stride, padding, in_shape, out=o)
        W, b = space.param("c.W").reshape(o, -1).copy(), space.param("c.b").copy() + 0.5
        dy = _smooth(np.random.default_rng(17), (4,) + out_shape, dtype)
        bounds = [(0, 2), (2, 5), (5, 6)]
        for o0, o1 in bounds:
            y = layer.forward_slice(x, W[o0:o1].reshape(-1), b[o0:o1], o0)
        db = np.empty(o, dtype)
        for o0, o1 in reversed(bounds):
            dx = layer.backward_slice(dy, W[o0:o1].reshape(-1), db[o0:o1], o0, need_dx=True)
        results.append((y, dx, W, db))
    for got, want, what in zip(results[1], results[0], ("y", "dx", "dW", "db"), strict=True):
        assert_same_bits(got, want, what)


# -- the source compiles for the GPU too -----------------------------------------------------------------

@pytest.mark.parametrize("dtype", DTYPES)
def test_kernel_source_compiles_with_nvcc(dtype, tmp_path):
    nvcc = shutil.which("nvcc")
    if nvcc is None:
        pytest.skip("nvcc is not installed")
    src = tmp_path / "k.cu"
    src.write_text(gpu_kernels.source(dtype))
    subprocess.run([nvcc, "-ptx", "-arch=sm_90", *gpu_kernels.OPTIONS, "-o", str(tmp_path / "k.ptx"),
                    str(src)], check=True, capture_output=True, text=True)
    ptx = (tmp_path / "k.ptx").read_text()
    assert all(f".entry {name}(" in ptx for name in gpu_kernels.KERNELS)


def test_numpy_and_kernel_less_modules_keep_the_numpy_path():
    assert not gpu_kernels.usable(np, np.float32)
    assert not gpu_kernels.usable(EMU, np.float16)
    assert gpu_kernels.usable(EMU, np.float64)
