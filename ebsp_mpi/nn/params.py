"""``ParamSpace``: every parameter of a model in one contiguous buffer, each tensor a named view.

A push or a pull is then the whole buffer or a list of per-tensor slices of it, with no packing
copies (docs/design.md, "Parameters on the wire"). Gradients live in a second buffer with the same layout,
so a layer's gradient slice can be pushed the moment its backward pass has written it (Poseidon's
wait-free backpropagation, Zhang et al., USENIX ATC 2017, section 3.1).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy

INITS = ("he_normal", "glorot_uniform", "zeros")


@dataclass(frozen=True)
class TensorSpec:
    """What a layer asks of the parameter space for one tensor.

    Parameters
    ----------
    name : str
        Unique name, ``"<layer>.<param>"``, e.g. ``"dense1.W"``.
    shape : tuple of int
        Shape of the tensor.
    init : str
        ``"he_normal"`` (He et al. 2015: N(0, 2/fan_in)), ``"glorot_uniform"`` (Glorot and Bengio
        2010: U(-l, l), l = sqrt(6/(fan_in + fan_out))) or ``"zeros"``.
    fan_in, fan_out : int
        Inputs and outputs that one weight connects (used by the initialisers).
    """

    name: str
    shape: tuple[int, ...]
    init: str
    fan_in: int
    fan_out: int

    def __post_init__(self):
        if self.init not in INITS:
            raise ValueError(f"tensor {self.name!r}: init {self.init!r} is not one of {INITS}")
        if any(int(d) < 1 for d in self.shape):
            raise ValueError(f"tensor {self.name!r}: shape {self.shape} has a dimension < 1")

    @property
    def size(self) -> int:
        """Number of elements."""
        return math.prod(self.shape)


@dataclass(frozen=True)
class TensorView:
    """Where one named tensor lives in the flat buffers.

    ``offset`` and ``size`` count elements (not bytes) of the flat ``data``/``grad`` buffers.
    """

    name: str
    offset: int
    size: int
    shape: tuple[int, ...]


def _to_host(a) -> numpy.ndarray:
    """A NumPy copy of a NumPy or CuPy array (CuPy arrays have ``.get()``)."""
    if hasattr(a, "get") and not isinstance(a, numpy.ndarray):
        return a.get()
    return numpy.array(a, copy=True)


def _draw(spec: TensorSpec, rng: numpy.random.Generator) -> numpy.ndarray:
    """Initial values of one tensor, float64, drawn from ``rng`` on the host."""
    if spec.init == "zeros":
        return numpy.zeros(spec.shape)
    if spec.init == "he_normal":
        return rng.normal(0.0, math.sqrt(2.0 / spec.fan_in), size=spec.shape)
    limit = math.sqrt(6.0 / (spec.fan_in + spec.fan_out))
    return rng.uniform(-limit, limit, size=spec.shape)


class ParamSpace:
    """All parameters of a model in ONE contiguous buffer, each tensor a named view.

    Parameters
    ----------
    specs : sequence of TensorSpec
        The tensors, in forward (layer) order; names must be unique.
    xp : module
        Array module, ``numpy`` or ``cupy``.
    dtype : numpy dtype
        Element type of both buffers (float32 for training, float64 for gradient checks).
    resident : collection of str, optional
        Hold only these tensors (an OSDP worker, whose on-demand layers' weights arrive just in time
        into a buffer of its own): ``data`` and ``grad`` then pack them back to back, while ``tensors``
        and :meth:`view` still describe every tensor where it lies in the whole model, the layout of
        the wire. None: every tensor, and the two layouts are one.

    Attributes
    ----------
    tensors : tuple of TensorView
        The views of every tensor, in forward order, packed back to back from offset 0: where each
        lies in the whole model.
    size : int
        Elements of the whole model.
    nbytes : int
        Bytes of one buffer as allocated (only the resident tensors' with `resident`).
    data, grad : xp.ndarray
        The flat parameter and gradient buffers: ``(size,)``, or the resident tensors only, at
        :meth:`local_offset`.
    """

    def __init__(self, specs: Sequence[TensorSpec], xp=numpy, dtype=numpy.float32, resident=None):
        self.xp = xp
        self.dtype = numpy.dtype(dtype)
        self.specs = tuple(specs)
        views, offset, seen = [], 0, set()
        for spec in self.specs:
            if spec.name in seen:
                raise ValueError(f"duplicate tensor name {spec.name!r} in ParamSpace")
            seen.add(spec.name)
            shape = tuple(int(d) for d in spec.shape)
            views.append(TensorView(spec.name, offset, spec.size, shape))
            offset += spec.size
        self.tensors = tuple(views)
        self.size = offset
        self._by_name = {v.name: v for v in self.tensors}
        unknown = sorted(set(resident or ()) - seen)
        if unknown:
            raise ValueError(f"ParamSpace: resident tensors {unknown} are not among {list(self._by_name)}")
        held = [v for v in views if resident is None or v.name in resident]
        self._local, local = {}, 0
        for v in held:
            self._local[v.name] = local
            local += v.size
        self.whole = local == self.size
        self.nbytes = local * self.dtype.itemsize
        self.data = xp.zeros(local, dtype=self.dtype)
        self.grad = xp.zeros(local, dtype=self.dtype)

    def __repr__(self) -> str:
        return f"ParamSpace({len(self.tensors)} tensors, {self.size} elements, {self.dtype})"

    def view(self, name: str) -> TensorView:
        """The ``TensorView`` of tensor ``name`` (KeyError naming the known tensors otherwise)."""
        try:
            return self._by_name[name]
        except KeyError:
            raise KeyError(f"no tensor {name!r}; known: {list(self._by_name)}") from None

    def holds(self, name: str) -> bool:
        """Whether tensor ``name`` lives in ``data``/``grad`` (always, unless built with ``resident``)."""
        return name in self._local

    def local_offset(self, name: str) -> int:
        """Where tensor ``name`` starts in ``data``/``grad`` (its ``view(name).offset`` unless built with
        ``resident``); a KeyError for a tensor not held."""
        self.view(name)
        try:
            return self._local[name]
        except KeyError:
            raise KeyError(f"tensor {name!r} is not held here (fetched on demand)") from None

    def _slice(self, buf, name: str):
        v, start = self.view(name), self.local_offset(name)
        return buf[start:start + v.size].reshape(v.shape)

    def param(self, name: str):
        """Tensor ``name`` as a reshaped view into ``data`` (writes go to the buffer)."""
        return self._slice(self.data, name)

    def grad_of(self, name: str):
        """Gradient of tensor ``name`` as a reshaped view into ``grad``."""
        return self._slice(self.grad, name)

    def init(self, seed: int) -> None:
        """Set every tensor to its initial values, deterministically in ``seed``.

        Values are drawn on the host with ``numpy.random.default_rng(seed)``, tensor by tensor in
        forward order, in float64, then cast and copied in, so NumPy and CuPy spaces built from the
        same specs get the same values.
        """
        if not self._local:  # nothing held (a model's shape alone): nothing to draw
            return
        rng = numpy.random.default_rng(seed)
        host = numpy.empty(self.data.size, dtype=numpy.float64)
        for spec, v in zip(self.specs, self.tensors, strict=True):
            values = _draw(spec, rng)  # drawn even when not held: the stream stays that of the whole model
            if self.holds(v.name):
                start = self._local[v.name]
                host[start:start + v.size] = values.ravel()
        host = host.astype(self.dtype)
        if hasattr(self.data, "set"):  # a CuPy array: copied in place, with no device temporary
            self.data.set(host)
        else:
            self.data[...] = host

    def zero_grad(self) -> None:
        """Set the whole gradient buffer to zero."""
        self.grad.fill(0)

    def state_dict(self) -> dict[str, numpy.ndarray]:
        """Host (NumPy) copies of every tensor, by name, in forward order."""
        self._require_whole("state_dict")
        host = _to_host(self.data)
        return {v.name: host[v.offset:v.offset + v.size].reshape(v.shape).copy()
                for v in self.tensors}

    def load_state_dict(self, d: Mapping[str, object]) -> None:
        """Copy named tensors into ``data``; names and shapes must match this space exactly.

        Raises
        ------
        ValueError
            Naming the missing or unexpected tensors, or the tensor whose shape differs.
        """
        self._require_whole("load_state_dict")
        missing = [n for n in self._by_name if n not in d]
        unexpected = [n for n in d if n not in self._by_name]
        if missing or unexpected:
            raise ValueError(f"state dict does not match the model: missing tensors {missing}, "
                             f"unexpected tensors {unexpected}")
        host = numpy.empty(self.size, dtype=self.dtype)
        for v in self.tensors:
            a = _to_host(d[v.name])
            if tuple(a.shape) != v.shape:
                raise ValueError(f"state dict tensor {v.name!r} has shape {tuple(a.shape)}, "
                                 f"expected {v.shape}")
            host[v.offset:v.offset + v.size] = a.ravel()
        self.data[...] = self.xp.asarray(host)

    def _require_whole(self, what: str) -> None:
        if not self.whole:
            raise ValueError(f"ParamSpace.{what}: this space holds only some of the model's tensors")
