"""The layer protocol every layer of ``ebsp_mpi.nn`` follows."""

from __future__ import annotations

from .params import ParamSpace, TensorSpec


class Layer:
    """Base of all layers: shapes at build time, views at bind time, then forward/backward.

    Shapes handed to ``build`` and returned by it are per sample (no batch dimension). Arrays handed
    to ``forward``/``backward`` carry the batch as their first axis. A layer never modifies its
    input in place (layers keep references to inputs and outputs for their backward pass).

    Attributes
    ----------
    tensor_names : tuple of str
        Names of this layer's tensors in the ``ParamSpace`` (empty for layers without parameters).
    reports_grad_blocks : bool
        ``backward`` also takes ``ready`` and ``block_elems`` and reports its weight gradient in
        blocks as they are done (wait-free backprop below the layer; see ``Dense.backward``).
    """

    tensor_names: tuple[str, ...] = ()
    reports_grad_blocks: bool = False

    def build(self, in_shape: tuple[int, ...], prefix: str) -> tuple[list[TensorSpec], tuple[int, ...]]:
        """Check ``in_shape`` and return ``(specs of this layer's tensors, out_shape)``.

        ``prefix`` (e.g. ``"conv1"``) names the tensors: ``"conv1.W"``, ``"conv1.b"``.
        """
        self.in_shape = tuple(in_shape)
        return [], self.in_shape

    def bind(self, space: ParamSpace) -> None:
        """Take views of this layer's parameters and gradients in ``space`` (no copies)."""
        self.xp = space.xp

    def forward(self, x, train: bool):
        """Output for a batch ``x``; when ``train``, keep what ``backward`` needs.

        An evaluation forward (``train=False``) leaves what a training forward kept untouched, so it
        may run between a training forward and its backward.
        """
        raise NotImplementedError

    def backward(self, dy, need_dx: bool = True):
        """Gradient w.r.t. the input of the last training ``forward``, given ``dy`` w.r.t. its output.

        Writes (overwrites, never accumulates) this layer's parameter gradients into the space's
        gradient views. With ``need_dx=False`` the input gradient is not computed and ``None`` is
        returned (the model's first layers: nothing consumes it).
        """
        raise NotImplementedError

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"


def pair(value, what: str) -> tuple[int, int]:
    """``value`` as a ``(height, width)`` pair of ints; a single int means both."""
    if isinstance(value, int):
        value = (value, value)
    try:
        a, b = (int(v) for v in value)
    except (TypeError, ValueError):
        raise ValueError(f"{what} must be an int or a pair of ints, got {value!r}") from None
    return a, b


def require_chw(in_shape: tuple[int, ...], layer: str) -> tuple[int, int, int]:
    """Check that a per-sample shape is ``(C, H, W)``; a ValueError naming ``layer`` otherwise."""
    if len(in_shape) != 3:
        raise ValueError(f"{layer} expects per-sample input of shape (C, H, W), got {tuple(in_shape)}")
    return tuple(int(d) for d in in_shape)
