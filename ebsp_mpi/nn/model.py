"""``Model``: a stack of layers over one ``ParamSpace``, and ``build_model`` for the named kinds."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy

from .base import Layer
from .factors import FactorSpace
from .layers import Conv2D, Dense, Flatten, MaxPool2D, ReLU
from .losses import cross_entropy_sum, softmax_cross_entropy
from .params import ParamSpace, TensorSpec

KINDS = ("mlp", "cnn", "cnn1d")


class Model:
    """A sequential classifier whose parameters all live in one ``ParamSpace``.

    Parameters
    ----------
    layers : sequence of Layer
        Applied in order; each is built on the previous one's output shape and bound to the space.
    in_shape : tuple of int
        Per-sample input shape (no batch dimension).
    num_classes : int
        Width of the last layer's output (the logits).
    kind : str
        A label (``"mlp"``, ``"cnn"``, or anything for hand-made stacks).
    xp, dtype
        Array module and element type of the parameter space.
    resident : collection of str, optional
        Hold only these tensors (``ParamSpace``'s `resident`): a layer with other tensors is left
        unbound, and whoever runs it binds its weights first (``nn.ondemand``, OSDP's on-demand
        layers). None: every tensor.

    Attributes
    ----------
    space : ParamSpace
        Parameters and gradients; tensors are named ``"<layer><k>.<param>"`` (``"conv1.W"``), numbered
        per layer type in forward order.
    """

    def __init__(self, layers: Sequence[Layer], in_shape, num_classes: int, *, kind: str = "custom",
                 xp=numpy, dtype=numpy.float32, resident=None):
        self.layers = list(layers)
        self.in_shape = tuple(int(d) for d in in_shape)
        self.num_classes = int(num_classes)
        self.kind = kind
        self.xp = xp
        specs, shape = stack_specs(self.layers, self.in_shape)
        if shape != (self.num_classes,):
            raise ValueError(f"model output shape is {shape}, expected ({self.num_classes},) logits")
        self.space = ParamSpace(specs, xp=xp, dtype=dtype, resident=resident)
        for layer in self.layers:
            if all(self.space.holds(name) for name in layer.tensor_names):
                layer.bind(self.space)
            else:
                layer.xp = xp
        # Nothing consumes the gradient below the first layer with parameters: skip computing it.
        self._first_trainable = next((i for i, layer in enumerate(self.layers) if layer.tensor_names), 0)

    def use_grad_buffer(self, buffer) -> None:
        """Compute the gradient into `buffer` from now on (a flat array like ``space.grad``, e.g. memory
        a server reads in place, ``runtime.transport.push_window``); what the gradient holds is kept."""
        if buffer.shape != self.space.grad.shape or buffer.dtype != self.space.grad.dtype:
            raise ValueError(f"gradient buffer of shape {buffer.shape} and {buffer.dtype}, expected "
                             f"{self.space.grad.shape} and {self.space.grad.dtype}")
        buffer[...] = self.space.grad
        self.space.grad = buffer
        for layer in self.layers:
            if layer.tensor_names and all(self.space.holds(name) for name in layer.tensor_names):
                layer.bind(self.space)

    def __repr__(self) -> str:
        inner = ", ".join(repr(layer) for layer in self.layers)
        return f"Model({self.kind}, in_shape={self.in_shape}, [{inner}], {self.space.size} params)"

    def _as_input(self, x):
        x = self.xp.asarray(x, dtype=self.space.dtype)
        if tuple(x.shape[1:]) != self.in_shape:
            dims = ", ".join(map(str, self.in_shape))
            raise ValueError(f"model input: expected batches of shape (N, {dims}), got {tuple(x.shape)}")
        return x

    def forward(self, x, train: bool = False):
        """Logits ``(N, num_classes)`` of a batch ``x`` of shape ``(N, *in_shape)``."""
        x = self._as_input(x)
        for layer in self.layers:
            x = layer.forward(x, train)
        return x

    def _backward(self, dlogits, on_grad_ready, block_elems: int, input_grad: bool):
        stop = 0 if input_grad else self._first_trainable
        dy = dlogits
        for i in range(len(self.layers) - 1, stop - 1, -1):
            dy = self.backward_layer(self.layers[i], dy, input_grad or i > stop, on_grad_ready, block_elems)
        return dy

    def backward_layer(self, layer, dy, need_dx: bool, on_grad_ready=None, block_elems: int = 0):
        """One layer's backward, its tensors reported to `on_grad_ready` (see :meth:`loss_and_grad`)."""
        if on_grad_ready is not None and layer.reports_grad_blocks:
            dx = layer.backward(dy, need_dx=need_dx, ready=on_grad_ready, block_elems=block_elems)
        else:
            dx = layer.backward(dy, need_dx=need_dx)
        if on_grad_ready is not None:
            for name in layer.tensor_names:
                on_grad_ready(name, self.space.view(name).size)
        return dx

    def _backward_factors(self, dlogits, on_grad_ready, block_elems: int, factors: FactorSpace,
                          on_factors_ready):
        """:meth:`_backward` where the dense layers whose W is in `factors` write factors, not ``dW``.

        Kept apart from :meth:`_backward` so that the path without factors runs exactly as before.
        """
        stop, dy = self._first_trainable, dlogits
        for i in range(len(self.layers) - 1, stop - 1, -1):
            layer, need_dx = self.layers[i], i > stop
            names = layer.tensor_names
            if isinstance(layer, Dense) and names[0] in factors:
                dy = layer.backward_factors(dy, factors, need_dx=need_dx, on_factors_ready=on_factors_ready)
                # W leaves as factors: reporting its (stale) dW would have it pushed.
                names = names[1:]
            elif on_grad_ready is not None and layer.reports_grad_blocks:
                dy = layer.backward(dy, need_dx=need_dx, ready=on_grad_ready, block_elems=block_elems)
            else:
                dy = layer.backward(dy, need_dx=need_dx)
            if on_grad_ready is not None:
                for name in names:
                    on_grad_ready(name, self.space.view(name).size)
        return dy

    def factor_layers(self) -> list[tuple[str, int, int]]:
        """``(name of W, d_in, d_out)`` of every dense layer, in forward order: what a
        :class:`FactorSpace` takes (keep the ones a plan sends as sufficient factors)."""
        return [(layer.tensor_names[0], layer.in_shape[0], layer.out) for layer in self.layers
                if isinstance(layer, Dense)]

    def _check_factors(self, factors: FactorSpace, batch: int) -> None:
        """A ValueError unless `factors` fits this model's dense layers and a batch of `batch` samples."""
        if factors.batch != batch:
            raise ValueError(f"loss_and_grad: the FactorSpace holds factors of batches of {factors.batch} "
                             f"samples, got a batch of {batch}")
        dense = {name: (d_in, d_out) for name, d_in, d_out in self.factor_layers()}
        for b in factors.blocks:
            if b.name not in dense:
                raise ValueError(f"loss_and_grad: FactorSpace layer {b.name!r} is not the W of a dense layer "
                                 f"of this model; dense layers: {list(dense)}")
            if dense[b.name] != (b.d_in, b.d_out):
                raise ValueError(f"loss_and_grad: FactorSpace layer {b.name!r} is ({b.d_in}, {b.d_out}), "
                                 f"the model's W is {dense[b.name]}")

    def loss_and_grad(self, x, y, on_grad_ready: Callable[[str, int], None] | None = None,
                      block_elems: int = 0, factors: FactorSpace | None = None,
                      on_factors_ready: Callable[[str], None] | None = None) -> float:
        """Mean softmax cross-entropy of the batch; overwrites every element of ``space.grad`` (but
        the ``dW`` of layers sent as sufficient factors, see `factors`).

        Parameters
        ----------
        x : array, shape (N, *in_shape)
        y : array of int, shape (N,)
        on_grad_ready : callable, optional
            ``on_grad_ready(name, stop)``: the first ``stop`` elements of tensor ``name``'s gradient
            are final. Called for each tensor of a layer right after its backward pass, last layer
            first, for wait-free backpropagation (Poseidon, Zhang et al. 2017, section 3.1): the
            caller may push those slices while earlier layers still compute.
        block_elems : int
            With `on_grad_ready`, dense layers compute their weight gradient in row blocks of at
            most this many elements and report each (0: whole layers only). The gradient's values
            do not depend on it beyond BLAS's summation order.
        factors : FactorSpace, optional
            Every dense layer whose W is in it writes its sufficient factors ``V`` (its input) and
            ``U`` (the error at its output) into its block instead of computing ``dW``, which is left
            untouched in ``space.grad`` (it keeps whatever it held); ``db`` and the input gradient
            are computed as usual, and the other layers behave as without `factors` (row-blocked
            reports included). The batch must have exactly ``factors.batch`` samples.
        on_factors_ready : callable, optional
            With `factors`: ``on_factors_ready(name of W)`` once that layer's block is final, last
            layer first, before its ``db`` and input gradient are computed (wait-free: the block can
            be sent at once). `on_grad_ready` is then not called for that W, only for its bias.

        Returns
        -------
        float
            The mean loss over the batch.

        Raises
        ------
        ValueError
            When `factors` holds another batch size, or a layer that is not one of this model's
            dense layers (or not of its shape).
        """
        if factors is None:
            loss, dlogits = softmax_cross_entropy(self.forward(x, train=True), self.xp.asarray(y))
            self._backward(dlogits, on_grad_ready, block_elems, input_grad=False)
            return loss
        x = self._as_input(x)
        self._check_factors(factors, x.shape[0])
        loss, dlogits = softmax_cross_entropy(self.forward(x, train=True), self.xp.asarray(y))
        self._backward_factors(dlogits, on_grad_ready, block_elems, factors, on_factors_ready)
        return loss

    def loss_and_input_grad(self, x, y):
        """Like :meth:`loss_and_grad`, and also return the gradient of the loss w.r.t. ``x``."""
        loss, dlogits = softmax_cross_entropy(self.forward(x, train=True), self.xp.asarray(y))
        return loss, self._backward(dlogits, None, 0, input_grad=True)

    def evaluate(self, x, y, batch_size: int = 1024) -> tuple[float, float]:
        """``(mean loss, accuracy)`` over a data set in batches of ``batch_size``; no gradients."""
        n = len(y)
        if n == 0:
            raise ValueError("evaluate: empty data set")
        loss_sum, correct = 0.0, 0
        for start in range(0, n, batch_size):
            stop = min(start + batch_size, n)
            logits = self.forward(x[start:stop], train=False)
            batch_loss, batch_correct = cross_entropy_sum(logits, self.xp.asarray(y[start:stop]))
            loss_sum, correct = loss_sum + batch_loss, correct + batch_correct
        return float(loss_sum) / n, float(correct) / n


def stack_specs(layers: Sequence[Layer], in_shape: tuple[int, ...]) -> tuple[list[TensorSpec], tuple[int, ...]]:
    """Build each layer on the previous one's output shape, allocating nothing.

    Tensors are named ``"<layer><k>.<param>"``, ``k`` counting the layers of one type in forward order.

    Returns
    -------
    specs : list of TensorSpec
        The tensors the layers ask for, in forward order.
    out_shape : tuple of int
        The last layer's per-sample output shape.
    """
    specs, shape, counts = [], tuple(in_shape), {}
    for layer in layers:
        base = type(layer).__name__.lower().replace("2d", "")
        counts[base] = counts.get(base, 0) + 1
        layer_specs, shape = layer.build(shape, f"{base}{counts[base]}")
        specs += layer_specs
    return specs, shape


def _positive_ints(values, what: str) -> tuple[int, ...]:
    values = tuple(int(v) for v in values)
    if any(v < 1 for v in values):
        raise ValueError(f"build_model: {what} must be positive ints, got {values}")
    return values


def build_model(kind: str, in_shape: tuple[int, ...], num_classes: int, *, hidden=(128,),
                channels=(8, 16), kernels=(5, 3, 3), xp=numpy, dtype=numpy.float32, seed: int = 0,
                resident=None) -> Model:
    """Build and initialise (``space.init(seed)``) one of the named models.

    Parameters
    ----------
    kind : str
        ``"mlp"``: Flatten -> [Dense(h), ReLU] for h in ``hidden`` -> Dense(num_classes); ``in_shape``
        may be ``(D,)`` or ``(C, H, W)``.
        ``"cnn"`` (LeNet-like): for c in ``channels``: Conv2D(c, 3, padding=1), ReLU, MaxPool2D(2) (the
        pool is left out once height or width is below 2) -> Flatten -> Dense(hidden[0]) -> ReLU ->
        Dense(num_classes); ``in_shape`` must be ``(C, H, W)``. An empty ``hidden`` goes straight to
        the output layer.
        ``"cnn1d"`` (MNIST-1D's ``ConvBase``, Greydanus & Kobak 2020): for c, k in ``channels``,
        ``kernels``: Conv2D(c, (1, k), stride (1, 2), padding (0, 1)), ReLU -> Flatten ->
        Dense(num_classes); a 1-D convolution along the last axis of ``in_shape = (C, H, L)``
        (MNIST-1D: ``(1, 1, 40)``), ``kernels`` repeating its last width; ``hidden`` is unused.
    in_shape : tuple of int
        Per-sample input shape.
    num_classes : int
        Number of classes (logits).
    hidden, channels : sequence of int
        Hidden widths and convolution channels.
    kernels : sequence of int
        Kernel widths of the ``cnn1d`` convolutions.
    xp, dtype
        Array module and parameter element type.
    seed : int
        Seed of the initial parameters.
    resident : collection of str, optional
        Hold only these tensors (see :class:`Model`).
    """
    in_shape = tuple(int(d) for d in in_shape)
    model = Model(_layers(kind, in_shape, num_classes, hidden, channels, kernels), in_shape, num_classes, kind=kind,
                  xp=xp, dtype=dtype, resident=resident)
    model.space.init(seed)
    return model


def model_specs(kind: str, in_shape: tuple[int, ...], num_classes: int, *, hidden=(128,),
                channels=(8, 16), kernels=(5, 3, 3)) -> list[TensorSpec]:
    """The tensors :func:`build_model` would allocate for these arguments, without allocating them.

    Their sizes give the number of parameters (``sum(s.size for s in specs)``) before a model too
    large for the machine is built.
    """
    in_shape = tuple(int(d) for d in in_shape)
    specs, _ = stack_specs(_layers(kind, in_shape, num_classes, hidden, channels, kernels), in_shape)
    return specs


def _layers(kind: str, in_shape: tuple[int, ...], num_classes: int, hidden, channels,
            kernels=(5, 3, 3)) -> list[Layer]:
    """The layer stack of model ``kind`` (see :func:`build_model`), its arguments checked."""
    hidden = _positive_ints(hidden, "hidden sizes")
    channels = _positive_ints(channels, "channels")
    kernels = _positive_ints(kernels, "kernel widths")
    if int(num_classes) < 2:
        raise ValueError(f"build_model: num_classes must be >= 2, got {num_classes}")
    if kind == "mlp":
        layers = [Flatten()]
        for h in hidden:
            layers += [Dense(h), ReLU()]
    elif kind == "cnn":
        if len(in_shape) != 3:
            raise ValueError(f"build_model: kind 'cnn' needs in_shape (C, H, W), got {in_shape}")
        layers, (h, w) = [], in_shape[1:]
        for c in channels:
            layers += [Conv2D(c, 3, padding=1), ReLU()]
            if h >= 2 and w >= 2:
                layers.append(MaxPool2D(2))
                h, w = h // 2, w // 2
        layers.append(Flatten())
        if hidden:
            layers += [Dense(hidden[0]), ReLU()]
    elif kind == "cnn1d":
        layers = _conv1d_layers(in_shape, channels, kernels)
    else:
        raise ValueError(f"build_model: unknown kind {kind!r}; allowed kinds: {', '.join(KINDS)}")
    layers.append(Dense(num_classes, init="glorot_uniform"))
    return layers


def _conv1d_layers(in_shape: tuple[int, ...], channels, kernels) -> list[Layer]:
    """MNIST-1D's convolutions as Conv2D with kernels of height 1, and the Flatten before its classifier."""
    if len(in_shape) != 3:
        raise ValueError(f"build_model: kind 'cnn1d' needs in_shape (C, H, L), got {in_shape}")
    if not kernels:
        raise ValueError("build_model: kind 'cnn1d' needs at least one kernel width")
    layers = []
    for i, c in enumerate(channels):
        width = kernels[min(i, len(kernels) - 1)]
        layers += [Conv2D(c, (1, width), stride=(1, 2), padding=(0, 1)), ReLU()]
    return layers + [Flatten()]
