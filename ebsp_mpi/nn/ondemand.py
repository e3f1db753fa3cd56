"""One training step of a model whose OSDP on-demand layers hold no weights between uses.

:meth:`OnDemandStep.loss_and_grad` runs the items of a :class:`~ebsp_mpi.plan.osdp_schedule.Schedule` in
order. A resident layer computes as in :meth:`Model.loss_and_grad` (its gradient in the ``ParamSpace``, each
tensor reported to `on_grad_ready` for wait-free backprop). An on-demand item computes with its unit
in the fetch buffer, which a *transport* fills and empties (the worker's MPI messages; in the tests,
copies from a whole model):

- forward: a whole layer as usual; a Dense slice k adds its partial product ``x[:, rows_k] @ W_k``
  into the output (the first writes it, the others go through one preallocated temporary), and the
  last slice adds b; a Conv2D slice writes its own output channels (``Conv2D.forward_slice``);
- backward, last slice first: the input gradient first (it reads W; a Dense slice writes its
  columns of dx, a Conv2D slice adds its part of the column gradient onto dx), then ``dW`` written
  over W and ``db`` over b in the same buffer, which the transport pushes before the next item (no
  gradient buffer of its own).

Values equal :meth:`Model.loss_and_grad`'s up to the summation order of the split products. Pure:
no MPI; NumPy or CuPy through the model's ``xp``.
"""

from __future__ import annotations

from .layers import Dense
from .losses import softmax_cross_entropy


class Transport:
    """What moves units in and out of the fetch buffer (``buffer``, a flat array of the model's dtype).

    ``fetch(i)`` starts bringing item i's unit to its place; ``arrived(i)`` waits until it is there;
    ``push(i)`` sends the gradient now over item i's unit and returns once the place may be reused.
    """

    buffer = None

    def fetch(self, i: int) -> None:
        raise NotImplementedError

    def arrived(self, i: int) -> None:
        raise NotImplementedError

    def push(self, i: int) -> None:
        raise NotImplementedError


class OnDemandStep:
    """Runs the steps of `model` under `schedule`, with a partial-product temporary for split layers."""

    def __init__(self, model, schedule, batch: int):
        self.model, self.schedule = model, schedule
        xp, dtype = model.xp, model.space.dtype
        widths = [model.layers[first].out for (first, _), s in zip(schedule.blocks, schedule.slices, strict=True)
                  if s > 1 and isinstance(model.layers[first], Dense)]
        self.temp = xp.empty(batch * max(widths, default=0), dtype=dtype)  # the split_temp_bytes of the plan

    def loss_and_grad(self, x, y, transport: Transport, on_grad_ready=None, block_elems: int = 0) -> float:
        """The batch's mean loss; the resident layers' gradient in ``space.grad``, the on-demand ones'
        pushed through `transport` (see the module docstring)."""
        model, sched = self.model, self.schedule
        items = sched.items
        h, loss = model._as_input(x), None
        for i, item in enumerate(items):
            if sched.overlap and i + 1 < len(items) and items[i + 1].fetched:
                transport.fetch(i + 1)  # while this item computes
            if item.fetched:
                if not sched.overlap:
                    transport.fetch(i)
                transport.arrived(i)
            if item.kind == "prefix":
                h = self._forward_layers(h, 0, sched.prefix)
            elif item.kind == "forward":
                h = self._forward(item, h, transport)
                if item.block == len(sched.blocks) - 1 and self._last_of_block(item):
                    loss, self._dy = softmax_cross_entropy(h, model.xp.asarray(y))
            else:
                self._backward(item, transport, on_grad_ready, block_elems)
                if item.unit is not None:
                    transport.push(i)
        return loss

    # -- forward -----------------------------------------------------------------------------------

    def _forward_layers(self, h, first: int, stop: int):
        for layer in self.model.layers[first:stop]:
            h = layer.forward(h, True)
        return h

    def _last_of_block(self, item) -> bool:
        return item.unit is None or self.schedule.units[item.unit].k == self.schedule.units[item.unit].slices - 1

    def _forward(self, item, h, transport):
        first, stop = self.schedule.blocks[item.block]
        layer = self.model.layers[first]
        if item.unit is None:
            return self._forward_layers(h, first, stop)
        unit = self.schedule.units[item.unit]
        if unit.slices == 1:
            self._bind(layer, unit, item.at, transport.buffer)
            return self._forward_layers(h, first, stop)
        W, b = self._slice_arrays(unit, item.at, transport.buffer)
        y = layer.forward_slice(h, W, b, unit.row0, self.temp)
        return h if y is None else self._forward_layers(y, first + 1, stop)  # the next slice reads h

    @staticmethod
    def _slice_arrays(unit, at: int, buffer):
        """A slice's rows of W (flat) and its part of b (a Dense's whole b on its last slice, else
        empty; a Conv2D's channels' b), as its unit lies in the fetch buffer: W's rows, then b."""
        region = buffer[at:at + unit.elems]
        return region[:unit.w_elems], region[unit.w_elems:]

    @classmethod
    def _bind(cls, layer, unit, at: int, buffer) -> None:
        """A whole on-demand layer computes with its unit as W and b, and writes dW, db over them."""
        W, b = cls._slice_arrays(unit, at, buffer)
        layer.bind_arrays(W, b, W, b)

    # -- backward ----------------------------------------------------------------------------------

    def _backward(self, item, transport, on_grad_ready, block_elems) -> None:
        """Item's backward from the output gradient ``self._dy``, which it replaces by the input
        gradient. Only ``self`` refers to it: a caller holding it would keep it alive while the input
        gradient is computed, one more activation at the peak than ``Model.loss_and_grad`` holds."""
        dy, self._dy = self._dy, None
        self._dy = self._backward_item(item, dy, transport, on_grad_ready, block_elems)

    def _backward_item(self, item, dy, transport, on_grad_ready, block_elems):
        model = self.model
        first, stop = self.schedule.blocks[item.block]
        unit = None if item.unit is None else self.schedule.units[item.unit]
        if unit is None or unit.k == unit.slices - 1:  # the block's first backward item
            for i in range(stop - 1, first, -1):
                dy = model.layers[i].backward(dy, need_dx=True)
        layer, need_dx = model.layers[first], first > model._first_trainable
        if unit is None:
            return model.backward_layer(layer, dy, need_dx, on_grad_ready, block_elems)
        if unit.slices == 1:
            return self._backward_whole(layer, unit, item.at, transport.buffer, dy, need_dx)
        return self._backward_slice(layer, unit, item.at, transport.buffer, dy, need_dx)

    def _backward_whole(self, layer, unit, at, buffer, dy, need_dx):
        self._bind(layer, unit, at, buffer)
        return layer.backward(dy, need_dx=need_dx, dx_first=True)  # dx reads W before dW overwrites it

    def _backward_slice(self, layer, unit, at, buffer, dy, need_dx):
        """Slice k of a split layer, last slice first (``Dense.backward_slice``,
        ``Conv2D.backward_slice``): the output gradient passes on to the slices before it; slice 0,
        the last one run, returns the whole input gradient."""
        W, db = self._slice_arrays(unit, at, buffer)
        dx = layer.backward_slice(dy, W, db, unit.row0, need_dx)
        return dy if unit.k > 0 else dx
