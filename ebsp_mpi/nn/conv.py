"""2-D convolution (NCHW) by im2col and one large GEMM per product."""

from __future__ import annotations

from . import gpu_kernels
from .base import Layer, pair, require_chw
from .params import ParamSpace, TensorSpec


class Conv2D(Layer):
    """2-D cross-correlation over NCHW batches, ``y[n, o] = sum_c W[o, c] * x[n, c] + b[o]``.

    Parameters
    ----------
    out_channels : int
        Output channels O.
    kernel, stride, padding : int or (int, int)
        Kernel size (kh, kw), stride (sh, sw) and zero padding (ph, pw) on each side.
    init : str
        Initialiser of ``W`` (shape ``(O, C, kh, kw)``); ``b`` (shape ``(O,)``) starts at zero.

    Notes
    -----
    im2col with the batch inside the columns: the windows are copied once (through a strided view)
    into a ``(C*kh*kw, N*G)`` matrix, so forward, weight gradient and column gradient are each ONE
    large GEMM; col2im adds the column gradient back with kh*kw strided-slice additions (a loop over
    kernel offsets, not pixels, and no scatter-add).

    On CuPy (float32 or float64) im2col and col2im are one CUDA kernel each (``gpu_kernels``), as at
    a GPU worker's batch sizes the kh*kw launches, not the arithmetic, set the time: im2col gathers
    the columns straight from ``x`` (no padded copy of the input), and col2im is a gather, one thread
    per element of the padded input gradient, that adds its contributions in the loop's order above
    (offsets ascending) onto zero, without a zeroing pass: the result is the NumPy path's to the bit.
    Elsewhere (NumPy, a stand-in without kernels, other dtypes) the code above runs, on any ``xp``.

    With stride 1 the columns run over a "wide" grid of Ho rows of the padded row length (G = Ho*row),
    so every kernel offset is one contiguous run of the flattened padded image: im2col and col2im
    then copy long contiguous runs instead of rows of Wo. Rows are stored W + pw long, sharing one
    run of zeros between the right padding of a row and the left padding of the next, so only
    row - Wo = kw - 1 - pw columns per row are extra (1 for a 3x3 kernel with padding 1): they
    read wrapped-around pixels, their outputs are dropped and their gradients are zero. With a
    stride the grid is the plain Ho x Wo.
    """

    def __init__(self, out_channels: int, kernel, stride=1, padding=0, init: str = "he_normal"):
        if int(out_channels) < 1:
            raise ValueError(f"Conv2D: out_channels must be >= 1, got {out_channels}")
        self.out_channels = int(out_channels)
        self.kernel = pair(kernel, "Conv2D kernel")
        self.stride = pair(stride, "Conv2D stride")
        self.padding = pair(padding, "Conv2D padding")
        if min(self.kernel) < 1 or min(self.stride) < 1 or min(self.padding) < 0:
            raise ValueError(f"Conv2D: need kernel >= 1, stride >= 1, padding >= 0; got kernel "
                             f"{self.kernel}, stride {self.stride}, padding {self.padding}")
        self.init = init
        self._bufs = {}

    def __repr__(self) -> str:
        return (f"Conv2D({self.out_channels}, kernel={self.kernel}, stride={self.stride}, "
                f"padding={self.padding})")

    def build(self, in_shape, prefix):
        c, h, w = require_chw(in_shape, "Conv2D")
        (kh, kw), (sh, sw), (ph, pw) = self.kernel, self.stride, self.padding
        hp, wp = h + 2 * ph, w + 2 * pw
        ho, wo = (hp - kh) // sh + 1, (wp - kw) // sw + 1
        if ho < 1 or wo < 1:
            raise ValueError(f"Conv2D: kernel {self.kernel} with padding {self.padding} does not fit "
                             f"the input (C, H, W) = {(c, h, w)}")
        self.in_shape, self.out_hw = (c, h, w), (ho, wo)
        self.wide = (sh, sw) == (1, 1)
        if self.wide:
            # Consecutive rows share one run of pw zeros (right padding of a row = left padding of
            # the next), which is enough while pw <= kw - 1, and fewer wide columns are wasted.
            self.row = w + pw if pw <= kw - 1 else wp
            self.grid_w = self.row
            # The last offset's run overruns the padded rows by kw - 1 elements: zeros to read.
            self.plane = hp * self.row + kw - 1
        else:
            self.row, self.grid_w, self.plane = wp, wo, hp * wp
        self.padded_h = hp
        o = self.out_channels
        self.tensor_names = (f"{prefix}.W", f"{prefix}.b")
        fan_in, fan_out = c * kh * kw, o * kh * kw
        specs = [TensorSpec(self.tensor_names[0], (o, c, kh, kw), self.init, fan_in, fan_out),
                 TensorSpec(self.tensor_names[1], (o,), "zeros", fan_in, fan_out)]
        return specs, (o, ho, wo)

    def bind(self, space: ParamSpace) -> None:
        super().bind(space)
        w, b = self.tensor_names
        self.bind_arrays(space.param(w), space.param(b), space.grad_of(w), space.grad_of(b))

    def bind_arrays(self, W, b, dW, db) -> None:
        """Compute with these arrays as ``W``, ``b`` and their gradients (``bind`` takes them from a
        ParamSpace; an OSDP on-demand layer from its fetch buffer, the gradients over the weights)."""
        o = self.out_channels
        self.W2 = W.reshape(o, -1)       # (O, K) views: K = C*kh*kw
        self.b = b
        self.dW2 = dW.reshape(o, -1)
        self.db = db
        self._dtype = W.dtype

    def _scratch(self, name, shape, zero=False, keep=True):
        """A buffer kept between training steps (re-made when the shape changes), so that large
        temporaries do not pay fresh page faults every step; ``keep=False`` (evaluation, whose
        batches differ) makes a fresh one. ``zero``: zero-filled when made."""
        buf = self._bufs.get(name) if keep else None
        if buf is None or buf.shape != shape:
            make = self.xp.zeros if zero else self.xp.empty
            buf = make(shape, dtype=self._dtype)
            if keep:
                self._bufs[name] = buf
        return buf

    def _image(self, buf):
        """The ``(N, C, Hp, row)`` padded images inside a ``(N, C, plane)`` buffer (a view)."""
        hp, row = self.padded_h, self.row
        return buf[:, :, :hp * row].reshape(buf.shape[0], buf.shape[1], hp, row)

    def _columns(self, x, keep):
        """im2col: the ``(C*kh*kw, N*G)`` matrix of kernel windows, one copy through a strided view."""
        xp = self.xp
        n, c, h, w = x.shape
        (kh, kw), (sh, sw), (ph, pw) = self.kernel, self.stride, self.padding
        ho, wo = self.out_hw
        xs = self._kernel_strides(x)
        if xs is not None:
            # One kernel reads the windows straight from x (zeros where they reach the padding).
            shape = (c, kh, kw, n, ho * self.row) if self.wide else (c, kh, kw, n, ho, wo)
            cols = self._scratch("cols", shape, keep=keep)
            if self.wide:
                gpu_kernels.im2col_wide(xp, x, cols, xs, ho * self.row, self.kernel, self.row, self.padding)
            else:
                gpu_kernels.im2col_strided(xp, x, cols, xs, self.out_hw, self.kernel, self.stride,
                                           self.padding)
            return cols.reshape(c * kh * kw, -1)
        # Only the interior is ever written, so the zero border made with the buffer stays zero.
        buf = self._scratch("padded", (n, c, self.plane), zero=True, keep=keep)
        self._image(buf)[:, :, ph:ph + h, pw:pw + w] = x
        isz = buf.itemsize
        if self.wide:
            row = self.row
            s_n, s_c = buf.strides[:2]
            view = xp.lib.stride_tricks.as_strided(
                buf, shape=(c, kh, kw, n, ho * row), strides=(s_c, row * isz, isz, s_n, isz))
        else:
            img = self._image(buf)
            s_n, s_c, s_h, s_w = img.strides
            view = xp.lib.stride_tricks.as_strided(
                img, shape=(c, kh, kw, n, ho, wo), strides=(s_c, s_h, s_w, s_n, s_h * sh, s_w * sw))
        cols = self._scratch("cols", view.shape, keep=keep)
        cols[...] = view
        return cols.reshape(c * kh * kw, -1)

    def forward(self, x, train):
        xp = self.xp
        n = x.shape[0]
        o, (ho, wo) = self.out_channels, self.out_hw
        # Training columns live until backward; an evaluation forward in between must not touch them.
        cols = self._columns(x, keep=train)
        yg = self._scratch("yg", (o, n * ho * self.grid_w), keep=train)
        xp.matmul(self.W2, cols, out=yg)
        y = xp.empty((n, o, ho, wo), dtype=yg.dtype)
        # Dropping the wide columns, moving the batch axis first and adding the bias: one pass.
        xp.add(yg.reshape(o, n, ho, self.grid_w)[..., :wo].transpose(1, 0, 2, 3),
               self.b[:, None, None], out=y)
        if train:
            self._cols = cols
        return y

    def backward(self, dy, need_dx=True, dx_first=True):
        """Gradients of W and b, and ``dx`` when `need_dx`. The column gradient (which reads W) is
        always computed before ``dW`` is written, so ``dW`` may share W's memory (OSDP's on-demand
        layers write their gradient over the weights they fetched); it goes to a buffer kept between
        steps, so the order costs no memory. `dx_first` is ``Dense.backward``'s choice, accepted and
        always true here."""
        xp = self.xp
        cols, self._cols = self._cols, None
        n = dy.shape[0]
        o, (ho, wo) = self.out_channels, self.out_hw
        # Wide columns are not outputs: their gradient stays at the zero the buffer was made with.
        dyg = self._scratch("dy", (o, n, ho, self.grid_w), zero=True)
        dyg[..., :wo] = dy.transpose(1, 0, 2, 3)
        dyg = dyg.reshape(o, -1)
        if need_dx:
            dcols = self._scratch("dcols", cols.shape)
            xp.matmul(self.W2.T, dyg, out=dcols)
        xp.sum(dyg, axis=1, out=self.db)
        # (K, N*G) @ (N*G, O) then a small (K, O) transpose: BLAS runs this orientation faster
        # than (O, N*G) @ (N*G, K) with its long-strided transposed operand.
        dwt = self._scratch("dWt", cols.shape[:1] + (o,))
        xp.matmul(cols, dyg.T, out=dwt)
        self.dW2[...] = dwt.T
        if not need_dx:
            return None
        buf = self._input_grad(n)
        self._col2im_add(dcols, buf, onto_zero=True)
        return self._unpad(buf)

    # -- OSDP slices: a layer split along O, one slice of output channels at a time (nn.ondemand) -----

    def forward_slice(self, x, W, b, o0: int, temp=None):
        """Output channels ``[o0, o0 + b.size)`` with that slice's rows of W (flat) and its b, written
        into the layer's output scratch; the first slice (``o0 == 0``) makes the columns, the last one
        returns y (the others None). Equal to :meth:`forward`: each output is the same GEMM row plus
        the same bias. `temp` is not used (``Dense.forward_slice`` adds partial products through it)."""
        xp = self.xp
        n, o, (ho, wo) = x.shape[0], self.out_channels, self.out_hw
        o1 = o0 + b.size
        self._dtype = W.dtype
        if o0 == 0:
            self._cols = self._columns(x, keep=True)
        yg = self._scratch("yg", (o, n * ho * self.grid_w))
        part = yg[o0:o1]
        xp.matmul(W.reshape(o1 - o0, -1), self._cols, out=part)
        part += b[:, None]
        if o1 < o:
            return None
        y = xp.empty((n, o, ho, wo), dtype=yg.dtype)
        y[...] = yg.reshape(o, n, ho, self.grid_w)[..., :wo].transpose(1, 0, 2, 3)
        return y

    def backward_slice(self, dy, W, db, o0: int, need_dx: bool):
        """Backward of output channels ``[o0, o0 + db.size)``, called last slice first: their part of
        the column gradient added onto the input gradient (it reads W), then their ``dW`` written over
        W and ``db`` into `db`. The last slice (the first call) lays out dy once; the call for
        ``o0 == 0`` returns dx (the others None). col2im runs once per slice, a pass over the columns
        against a GEMM of ``o1 - o0`` rows: what keeps the column gradient to its one scratch."""
        xp = self.xp
        n, o, (ho, wo) = dy.shape[0], self.out_channels, self.out_hw
        o1 = o0 + db.size
        cols = self._cols
        if o1 == o:
            dyg = self._scratch("dy", (o, n, ho, self.grid_w), zero=True)
            dyg[..., :wo] = dy.transpose(1, 0, 2, 3)
            self._dx_sum = self._input_grad(n) if need_dx else None
        dyg = self._bufs["dy"].reshape(o, -1)[o0:o1]
        W2 = W.reshape(o1 - o0, -1)
        if need_dx:
            dcols = self._scratch("dcols", cols.shape)
            xp.matmul(W2.T, dyg, out=dcols)
            self._col2im_add(dcols, self._dx_sum, onto_zero=o1 == o)
        xp.sum(dyg, axis=1, out=db)
        k = cols.shape[0]
        dwt = self._scratch("dWt", (k, o)).reshape(-1)[:k * (o1 - o0)].reshape(k, o1 - o0)
        xp.matmul(cols, dyg.T, out=dwt)
        W2[...] = dwt.T
        if o0 > 0:
            return None
        self._cols, buf, self._dx_sum = None, self._dx_sum, None
        return None if buf is None else self._unpad(buf)

    # -- col2im -------------------------------------------------------------------------------------

    def _gpu(self, n) -> bool:
        """Whether col2im runs as one CUDA kernel for a batch of `n` (CuPy, float32 or float64, sizes
        the kernels can index); :meth:`_input_grad` and :meth:`_col2im_add` agree on it."""
        c = self.in_shape[0]
        kh, kw = self.kernel
        ho = self.out_hw[0]
        return (gpu_kernels.usable(self.xp, self._dtype)
                and gpu_kernels.fits(c * kh * kw * n * ho * self.grid_w, n * c * self.plane))

    def _kernel_strides(self, x):
        """im2col by kernel: `x`'s element strides where it may (see :meth:`_gpu`; `x` of the
        weights' dtype, its strides whole elements), else None."""
        if x.dtype != self._dtype or not self._gpu(x.shape[0]):
            return None
        xs = gpu_kernels.element_strides(x)
        return xs if xs is not None and gpu_kernels.fits(gpu_kernels.span(x.shape, xs)) else None

    def _input_grad(self, n):
        """The ``(N, C, plane)`` buffer that col2im adds onto: zeroed, or on the kernel path (where
        the first :meth:`_col2im_add`, ``onto_zero``, writes every element) uninitialised."""
        make = self.xp.empty if self._gpu(n) else self.xp.zeros
        return make((n, self.in_shape[0], self.plane), dtype=self._dtype)

    def _unpad(self, buf):
        """The input gradient: the interior of the padded images in `buf` (a view)."""
        _, h, w = self.in_shape
        ph, pw = self.padding
        return self._image(buf)[:, :, ph:ph + h, pw:pw + w]

    def _col2im_add(self, dcols, buf, onto_zero=False):
        """Add the ``(C*kh*kw, N*G)`` column gradient onto the padded input gradient `buf`.

        On CuPy one kernel does it (gpu_kernels: each element of `buf` adds its contributions in the
        order below, so the result is the same to the bit); `onto_zero` (`buf` straight from
        :meth:`_input_grad`) lets it write onto zero instead of reading `buf`. Otherwise one add per
        kernel offset, (i, j) ascending; `buf` is then zeroed already."""
        c = self.in_shape[0]
        (kh, kw), (sh, sw) = self.kernel, self.stride
        ho, wo = self.out_hw
        n = buf.shape[0]
        if self._gpu(n):
            dcols = self.xp.ascontiguousarray(dcols)     # the layer's own scratch: no copy
            if self.wide:
                gpu_kernels.col2im_wide(self.xp, dcols, buf, ho * self.row, self.kernel, self.row,
                                        accumulate=not onto_zero)
            else:
                gpu_kernels.col2im_strided(self.xp, dcols, buf, (self.padded_h, self.row), self.out_hw,
                                           self.kernel, self.stride, accumulate=not onto_zero)
            return
        if self.wide:
            row = self.row
            g = ho * row
            dcols = dcols.reshape(c, kh, kw, n, g)
            dst = buf.transpose(1, 0, 2)                            # (C, N, plane)
            for i in range(kh):
                for j in range(kw):
                    a = i * row + j
                    dst[:, :, a:a + g] += dcols[:, i, j]
        else:
            dcols = dcols.reshape(c, kh, kw, n, ho, wo)
            dst = self._image(buf).transpose(1, 0, 2, 3)            # (C, N, Hp, Wp)
            for i in range(kh):
                for j in range(kw):
                    dst[:, :, i:i + sh * ho:sh, j:j + sw * wo:sw] += dcols[:, i, j]
