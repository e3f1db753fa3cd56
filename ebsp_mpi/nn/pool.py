"""2-D max pooling (NCHW)."""

from __future__ import annotations

from . import gpu_kernels
from .base import Layer, pair, require_chw


class MaxPool2D(Layer):
    """Max over ``size`` windows moved by ``stride`` (default: ``size``), floor mode, no padding.

    Parameters
    ----------
    size, stride : int or (int, int)
        Window (kh, kw) and stride (sh, sw); rows and columns the last window does not reach get
        zero gradient.

    Notes
    -----
    Forward runs over the kh*kw kernel offsets (not pixels): each offset is one strided slice of
    the input, folded into the running maximum. Backward sends ``dy`` to the first offset (in
    row-major kernel order) whose input equals the maximum, so ties are resolved
    deterministically and each window's gradient goes to exactly one element: one masked
    strided write per offset, or an addition when windows overlap. No scatter-add is needed, so
    this code runs on any ``xp``.

    On CuPy (float32 or float64) forward and backward are one CUDA kernel each (``gpu_kernels``):
    forward takes each window's maximum with ``np.maximum``'s rules (NaN propagates); backward is a
    gather, one thread per input element, that applies the same tie rule and sums the windows
    holding it in the same order, writing every element of ``dx`` (0 where no window reaches).
    Outputs and gradients are the NumPy path's to the bit (NaN payloads aside). A non-contiguous
    ``x`` is copied once to a contiguous one there; ``dy`` is read through its strides.
    """

    def __init__(self, size, stride=None):
        self.size = pair(size, "MaxPool2D size")
        self.stride = self.size if stride is None else pair(stride, "MaxPool2D stride")
        if min(self.size) < 1 or min(self.stride) < 1:
            raise ValueError(f"MaxPool2D: size and stride must be >= 1, got {self.size}, {self.stride}")

    def __repr__(self) -> str:
        return f"MaxPool2D({self.size}, stride={self.stride})"

    def build(self, in_shape, prefix):
        c, h, w = require_chw(in_shape, "MaxPool2D")
        (kh, kw), (sh, sw) = self.size, self.stride
        ho, wo = (h - kh) // sh + 1, (w - kw) // sw + 1
        if ho < 1 or wo < 1:
            raise ValueError(f"MaxPool2D: window {self.size} is larger than the input "
                             f"(C, H, W) = {(c, h, w)}")
        self.in_shape, self.out_hw = (c, h, w), (ho, wo)
        return [], (c, ho, wo)

    def _window_slices(self):
        """Per kernel offset, in row-major order: the index of the strided input slice it reads."""
        (kh, kw), (sh, sw) = self.size, self.stride
        ho, wo = self.out_hw
        for i in range(kh):
            for j in range(kw):
                yield (slice(None), slice(None), slice(i, i + sh * (ho - 1) + 1, sh),
                       slice(j, j + sw * (wo - 1) + 1, sw))

    def _gpu(self, x) -> bool:
        """Whether this batch runs as CUDA kernels: CuPy, float32 or float64, sizes the kernels index."""
        return gpu_kernels.usable(self.xp, x.dtype) and gpu_kernels.fits(x.size)

    def forward(self, x, train):
        xp = self.xp
        if self._gpu(x):
            # One kernel; it reads x contiguous (a copy where x is a view), and so does backward.
            x = xp.ascontiguousarray(x)
            y = xp.empty((x.shape[0], x.shape[1]) + self.out_hw, dtype=x.dtype)
            gpu_kernels.maxpool_forward(xp, x, y, self.size, self.stride)
            if train:
                self._saved = (x, y)
            return y
        slices = self._window_slices()
        first = next(slices)
        y = x[first].copy()
        for index in slices:
            xp.maximum(y, x[index], out=y)
        # Backward finds the maxima again from x and y; layers never modify their inputs in place.
        if train:
            self._saved = (x, y)
        return y

    def backward(self, dy, need_dx=True):
        xp = self.xp
        (x, y), self._saved = self._saved, None
        if not need_dx:
            return None
        dys = gpu_kernels.element_strides(dy) if dy.dtype == x.dtype and self._gpu(x) else None
        if (dys is not None and x.flags.c_contiguous and y.flags.c_contiguous
                and gpu_kernels.fits(gpu_kernels.span(dy.shape, dys))):
            # One gather kernel writes every element of dx (0 where no window reaches).
            dx = xp.empty(x.shape, dtype=x.dtype)
            gpu_kernels.maxpool_backward(xp, x, y, dy, dys, dx, self.size, self.stride)
            return dx
        dx = xp.zeros((dy.shape[0],) + self.in_shape, dtype=dy.dtype)
        disjoint = all(s >= k for s, k in zip(self.stride, self.size, strict=True))
        # The first offset holding the maximum takes the gradient (ties: deterministic, once).
        # Boolean passes rather than a masked argmax update, which branches per element.
        taken = xp.zeros(y.shape, dtype=bool)
        for index in self._window_slices():
            winner = x[index] == y
            xp.greater(winner, taken, out=winner)        # a maximum not taken by an earlier offset
            xp.logical_or(taken, winner, out=taken)
            if disjoint:        # each input element is in one window at most: write in place
                xp.multiply(dy, winner, out=dx[index])
            else:
                dx[index] += dy * winner
        return dx
