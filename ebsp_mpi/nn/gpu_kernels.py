"""CUDA kernels for Conv2D's im2col and col2im and for MaxPool2D, used on CuPy.

On a GPU the layers' NumPy-style code launches one kernel per kernel offset (col2im: kh*kw strided
additions; max pooling: kh*kw strided maxima forward and about 18 elementwise passes backward), and at
the batch sizes a GPU worker trains with those launches, not the arithmetic, set the time. Each
kernel here does one of those loops in one launch, one thread per OUTPUT element (a gather, no
atomics), and does the NumPy path's float operations in the NumPy path's order, so the results are
bit-identical to it (float32 and float64):

- ``ebsp_im2col_wide`` / ``ebsp_im2col_strided``: the column matrix straight from ``x`` (zero where
  a window reaches the padding), instead of copying ``x`` into a zero-padded buffer and then the
  windows out of it. A copy, so trivially identical.
- ``ebsp_col2im_wide`` / ``ebsp_col2im_strided``: each element of the padded input gradient adds its
  column-gradient contributions for kernel offsets (i, j) in ascending row-major order, starting from
  the buffer's value (``accumulate``) or from +0.0 (the NumPy path's zeroed buffer), exactly the
  sequence of roundings the NumPy path's kh*kw slice additions give it.
- ``ebsp_maxpool_forward``: the window maximum over offsets in row-major order with ``np.maximum``'s
  rules: NaN propagates, and on equal values (only +0.0 against -0.0 can tell) the later operand
  is kept, as NumPy's ``maximum`` returns its second operand on ties.
- ``ebsp_maxpool_backward``: each input element collects ``dy * winner`` from every window holding
  it, offsets ascending (added onto +0.0 where windows overlap, written as the product where they
  do not, as the NumPy path does), where winner means it is the FIRST offset of the window whose
  input equals the window's maximum (a NaN maximum has no winner). Elements no window reaches get 0.

The kernels take only ``int`` sizes: callers check :func:`fits` first (every index below 2**30) and
take the NumPy path otherwise. Compiled with NVRTC through ``cupy.RawModule`` on first use, one module
per dtype, with ``--fmad=false`` (pool backward's ``v + d * f`` must not become a fused
multiply-add; the others have no product to fuse). :data:`KERNELS` holds each kernel's parameters and
body and :func:`source` the whole module's text, so that tests compile the exact same text on a CPU
(tests/test_nn_gpu_kernels.py emulates the launch with g++).
"""

from __future__ import annotations

import numpy as np

#: block size of every launch; the kernels loop over their elements with a grid stride
BLOCK = 256
#: most blocks a launch asks for (the grid-stride loop covers the rest)
MAX_BLOCKS = 1 << 16
#: every element count and index offset must stay below this (the kernels index with int)
INDEX_LIMIT = 1 << 30

_CTYPES = {np.dtype(np.float32): "float", np.dtype(np.float64): "double"}

_LOOP = "for (int e = blockIdx.x * blockDim.x + threadIdx.x; e < total; e += blockDim.x * gridDim.x)"

#: name -> (parameter list, body): each kernel is ``extern "C" __global__ void name(params) { body }``
#: over ``T`` (float or double, a typedef at the top of the module's source)
KERNELS = {
    "ebsp_im2col_wide": (
        ("const T* __restrict__ x, T* __restrict__ cols, int total, int n, int h, int w, "
        "int sxn, int sxc, int sxh, int sxw, int g, int kh, int kw, int row, int ph, int pw"),
        # cols is (C, kh, kw, N, G), G = Ho*row: column q of offset (i, j) reads position
        # i*row + j + q of the padded plane, whose rows are `row` long with the image at (ph, pw)
        _LOOP + """ {
        int q = e % g;
        int t = e / g;
        int ni = t % n;
        t /= n;
        int j = t % kw;
        t /= kw;
        int i = t % kh;
        int ci = t / kh;
        int p = i * row + j + q;
        int r = p / row - ph;
        int s = p % row - pw;
        cols[e] = (r >= 0 && r < h && s >= 0 && s < w) ? x[ni * sxn + ci * sxc + r * sxh + s * sxw] : (T)0;
    }"""),
    "ebsp_im2col_strided": (
        ("const T* __restrict__ x, T* __restrict__ cols, int total, int n, int h, int w, "
        "int sxn, int sxc, int sxh, int sxw, int ho, int wo, int kh, int kw, int sh, int sw, "
        "int ph, int pw"),
        # cols is (C, kh, kw, N, Ho, Wo): padded pixel (oh*sh + i, ow*sw + j)
        _LOOP + """ {
        int ow = e % wo;
        int t = e / wo;
        int oh = t % ho;
        t /= ho;
        int ni = t % n;
        t /= n;
        int j = t % kw;
        t /= kw;
        int i = t % kh;
        int ci = t / kh;
        int r = oh * sh + i - ph;
        int s = ow * sw + j - pw;
        cols[e] = (r >= 0 && r < h && s >= 0 && s < w) ? x[ni * sxn + ci * sxc + r * sxh + s * sxw] : (T)0;
    }"""),
    "ebsp_col2im_wide": (
        ("const T* __restrict__ dcols, T* __restrict__ buf, int total, int n, int c, int plane, int g, "
        "int kh, int kw, int row, int accumulate"),
        # buf is (N, C, plane); dcols (C, kh, kw, N, G) adds run (i, j) at plane position i*row + j
        _LOOP + """ {
        int p = e % plane;
        int nc = e / plane;
        int ci = nc % c;
        int ni = nc / c;
        const T* src = dcols + (ci * kh * kw * n + ni) * g;
        int step = n * g;
        T v = accumulate ? buf[e] : (T)0;
        for (int i = 0; i < kh; ++i) {
            for (int j = 0; j < kw; ++j) {
                int q = p - i * row - j;
                if (q >= 0 && q < g) {
                    v = v + src[(i * kw + j) * step + q];
                }
            }
        }
        buf[e] = v;
    }"""),
    "ebsp_col2im_strided": (
        ("const T* __restrict__ dcols, T* __restrict__ buf, int total, int n, int c, int hp, int wp, "
        "int ho, int wo, int kh, int kw, int sh, int sw, int accumulate"),
        # buf is (N, C, Hp*Wp); dcols (C, kh, kw, N, Ho, Wo) adds (oh, ow) of offset (i, j) at
        # padded pixel (oh*sh + i, ow*sw + j)
        _LOOP + """ {
        int pc = e % wp;
        int t = e / wp;
        int pr = t % hp;
        t /= hp;
        int ci = t % c;
        int ni = t / c;
        int g = ho * wo;
        const T* src = dcols + (ci * kh * kw * n + ni) * g;
        int step = n * g;
        T v = accumulate ? buf[e] : (T)0;
        for (int i = 0; i < kh; ++i) {
            int a = pr - i;
            if (a < 0) break;
            if (a % sh != 0) continue;
            int oh = a / sh;
            if (oh >= ho) continue;
            for (int j = 0; j < kw; ++j) {
                int b = pc - j;
                if (b < 0) break;
                if (b % sw != 0) continue;
                int ow = b / sw;
                if (ow >= wo) continue;
                v = v + src[(i * kw + j) * step + oh * wo + ow];
            }
        }
        buf[e] = v;
    }"""),
    "ebsp_maxpool_forward": (
        ("const T* __restrict__ x, T* __restrict__ y, int total, int h, int w, int ho, int wo, "
        "int kh, int kw, int sh, int sw"),
        # x (N, C, H, W) and y (N, C, Ho, Wo) contiguous
        _LOOP + """ {
        int ow = e % wo;
        int t = e / wo;
        int oh = t % ho;
        int nc = t / ho;
        const T* base = x + nc * h * w + oh * sh * w + ow * sw;
        T v = base[0];
        for (int i = 0; i < kh; ++i) {
            for (int j = 0; j < kw; ++j) {
                if (i == 0 && j == 0) continue;
                T a = base[i * w + j];
                v = (v > a || v != v) ? v : a;
            }
        }
        y[e] = v;
    }"""),
    "ebsp_maxpool_backward": (
        ("const T* __restrict__ x, const T* __restrict__ y, const T* __restrict__ dy, "
        "T* __restrict__ dx, int total, int c, int h, int w, int ho, int wo, int kh, int kw, "
        "int sh, int sw, int sdn, int sdc, int sdh, int sdw, int overlap"),
        # x, dx (N, C, H, W) and y (N, C, Ho, Wo) contiguous; dy (N, C, Ho, Wo) with element strides
        _LOOP + """ {
        int s = e % w;
        int t = e / w;
        int r = t % h;
        int nc = t / h;
        int ci = nc % c;
        int ni = nc / c;
        const T* xb = x + nc * h * w;
        const T* yb = y + nc * ho * wo;
        const T* db = dy + ni * sdn + ci * sdc;
        T xv = x[e];
        T v = (T)0;
        for (int i = 0; i < kh; ++i) {
            int a = r - i;
            if (a < 0) break;
            if (a % sh != 0) continue;
            int oh = a / sh;
            if (oh >= ho) continue;
            for (int j = 0; j < kw; ++j) {
                int b = s - j;
                if (b < 0) break;
                if (b % sw != 0) continue;
                int ow = b / sw;
                if (ow >= wo) continue;
                T m = yb[oh * wo + ow];
                T d = db[oh * sdh + ow * sdw];
                bool win = (xv == m);
                if (win) {
                    // an earlier offset of this window holding the maximum takes the gradient instead
                    const T* wb = xb + oh * sh * w + ow * sw;
                    for (int i2 = 0; i2 <= i && win; ++i2) {
                        int jend = (i2 < i) ? kw : j;
                        for (int j2 = 0; j2 < jend; ++j2) {
                            if (wb[i2 * w + j2] == m) {
                                win = false;
                                break;
                            }
                        }
                    }
                }
                T f = win ? (T)1 : (T)0;
                v = overlap ? v + d * f : d * f;
            }
        }
        dx[e] = v;
    }"""),
}


def source(dtype) -> str:
    """The CUDA source of every kernel for `dtype` (float32 or float64), as compiled."""
    parts = [f"typedef {_CTYPES[np.dtype(dtype)]} T;\n"]
    for name, (params, body) in KERNELS.items():
        parts.append(f'extern "C" __global__ void {name}({params}) {{\n    {body}\n}}\n')
    return "\n".join(parts)


#: compile options: no fused multiply-add, so that products round as NumPy's do
OPTIONS = ("--fmad=false",)

_modules: dict = {}


def usable(xp, dtype) -> bool:
    """True when `xp` compiles kernels (CuPy; not NumPy, nor a stand-in without them) and `dtype` is
    float32 or float64."""
    return hasattr(xp, "RawModule") and np.dtype(dtype) in _CTYPES


def fits(*counts) -> bool:
    """Every element count or index bound below :data:`INDEX_LIMIT` (the kernels index with int)."""
    return all(0 <= int(k) < INDEX_LIMIT for k in counts)


def element_strides(a):
    """`a`'s strides in elements, or None where one is not a whole number of elements or is negative."""
    isz = a.itemsize
    if any(s % isz or s < 0 for s in a.strides):
        return None
    return tuple(s // isz for s in a.strides)


def span(shape, strides) -> int:
    """One past the largest element offset of an array with these element strides."""
    return 1 + sum((d - 1) * s for d, s in zip(shape, strides, strict=True) if d > 0)


def _function(xp, dtype, name):
    key = (id(xp), np.dtype(dtype))
    module = _modules.get(key)
    if module is None:
        module = _modules[key] = (xp, xp.RawModule(code=source(dtype), options=OPTIONS), {})
    _, raw, functions = module
    fn = functions.get(name)
    if fn is None:
        fn = functions[name] = raw.get_function(name)
    return fn


def _launch(xp, name, total, arrays, ints):
    """Launch kernel `name` for the dtype of ``arrays[0]`` over `total` elements: its arguments are
    `arrays` (device pointers), then `total`, then `ints`, each as a C int."""
    if total == 0:
        return
    blocks = min((total + BLOCK - 1) // BLOCK, MAX_BLOCKS)
    args = tuple(arrays) + tuple(np.int32(v) for v in (total, *ints))
    _function(xp, arrays[0].dtype, name)((blocks,), (BLOCK,), args)


def im2col_wide(xp, x, cols, xs, g, kernel, row, padding):
    """``cols`` (C, kh, kw, N, G) of the wide layout from ``x`` (N, C, H, W) with element strides
    `xs` (:func:`element_strides`)."""
    n, _, h, w = x.shape
    (kh, kw), (ph, pw) = kernel, padding
    _launch(xp, "ebsp_im2col_wide", cols.size, (x, cols), (n, h, w, *xs, g, kh, kw, row, ph, pw))


def im2col_strided(xp, x, cols, xs, out_hw, kernel, stride, padding):
    """``cols`` (C, kh, kw, N, Ho, Wo) from ``x`` (N, C, H, W) with element strides `xs`."""
    n, _, h, w = x.shape
    (ho, wo), (kh, kw), (sh, sw), (ph, pw) = out_hw, kernel, stride, padding
    _launch(xp, "ebsp_im2col_strided", cols.size, (x, cols),
            (n, h, w, *xs, ho, wo, kh, kw, sh, sw, ph, pw))


def col2im_wide(xp, dcols, buf, g, kernel, row, accumulate: bool):
    """Add (or, without `accumulate`, write onto zero) the wide layout's column gradient ``dcols``
    (C*kh*kw, N*G) into ``buf`` (N, C, plane), both contiguous."""
    n, c, plane = buf.shape
    kh, kw = kernel
    _launch(xp, "ebsp_col2im_wide", buf.size, (dcols, buf),
            (n, c, plane, g, kh, kw, row, int(accumulate)))


def col2im_strided(xp, dcols, buf, padded_hw, out_hw, kernel, stride, accumulate: bool):
    """As :func:`col2im_wide` for the strided layout: ``dcols`` (C*kh*kw, N*Ho*Wo), ``buf``
    (N, C, Hp*Wp)."""
    n, c, _ = buf.shape
    (hp, wp), (ho, wo), (kh, kw), (sh, sw) = padded_hw, out_hw, kernel, stride
    _launch(xp, "ebsp_col2im_strided", buf.size, (dcols, buf),
            (n, c, hp, wp, ho, wo, kh, kw, sh, sw, int(accumulate)))


def maxpool_forward(xp, x, y, size, stride):
    """``y`` (N, C, Ho, Wo) = the window maxima of contiguous ``x`` (N, C, H, W)."""
    _, _, h, w = x.shape
    _, _, ho, wo = y.shape
    (kh, kw), (sh, sw) = size, stride
    _launch(xp, "ebsp_maxpool_forward", y.size, (x, y), (h, w, ho, wo, kh, kw, sh, sw))


def maxpool_backward(xp, x, y, dy, dys, dx, size, stride):
    """``dx`` (N, C, H, W, contiguous, every element written) from contiguous ``x`` and ``y`` and
    ``dy`` with element strides `dys`."""
    _, c, h, w = x.shape
    _, _, ho, wo = y.shape
    (kh, kw), (sh, sw) = size, stride
    overlap = int(sh < kh or sw < kw)
    _launch(xp, "ebsp_maxpool_backward", dx.size, (x, y, dy, dx),
            (c, h, w, ho, wo, kh, kw, sh, sw, *dys, overlap))
