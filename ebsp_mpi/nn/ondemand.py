"""One training step of a model whose OSDP on-demand layers hold no weights between uses.

:meth:`OnDemandStep.loss_and_grad` runs the items of a :class:`~ebsp_mpi.plan.osdp_schedule.Schedule` in
order. A resident layer computes as in :meth:`Model.loss_and_grad` (its gradient in the ``ParamSpace``, each
tensor reported to `on_grad_ready` for wait-free backprop). An on-demand item computes with its unit
in the fetch buffer, which a *transport* fills and empties (the worker's MPI messages; in the tests,
copies from a whole model):

- forward: a whole layer as usual; a Dense slice k adds its partial product ``x[:, rows_k] @ W_k``
  into the output (the first writes it, the others go through one preallocated temporary), and the
  last slice adds b;
- backward, last slice first: the input gradient first (it reads W), then ``dW`` written over W and
  ``db`` over b in the same buffer, which the transport pushes before the next item (no gradient
  buffer of its own).

Values equal :meth:`Model.loss_and_grad`'s up to the summation order of the split products. Pure:
no MPI; NumPy or CuPy through the model's ``xp``.
"""

from __future__ import annotations

from .layers import Conv2D
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
                  if s > 1]
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
        xp, region = self.model.xp, transport.buffer[item.at:item.at + unit.elems]
        rows, out = unit.row1 - unit.row0, layer.out
        W = region[:rows * out].reshape(rows, out)
        part = h[:, unit.row0:unit.row1]
        if unit.k == 0:
            layer._x = h  # the layer's input, for every slice's backward
            self._y = xp.matmul(part, W)
        else:
            tmp = self.temp[:h.shape[0] * out].reshape(h.shape[0], out)
            xp.matmul(part, W, out=tmp)
            self._y += tmp
        if unit.k < unit.slices - 1:
            return h  # the next slice reads the same input
        self._y += region[rows * out:]
        y, self._y = self._y, None
        return self._forward_layers(y, first + 1, stop)

    @staticmethod
    def _bind(layer, unit, at: int, buffer) -> None:
        """A whole on-demand layer computes with its unit as W and b, and writes dW, db over them."""
        region = buffer[at:at + unit.elems]
        w = region.size - (layer.out_channels if isinstance(layer, Conv2D) else layer.out)
        layer.bind_arrays(region[:w], region[w:], region[:w], region[w:])

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
        """Slice k of a split Dense, last slice first: its rows of dx, then dW_k over W_k (and db over
        b with the last slice); the whole dx is returned with slice 0, the last one run."""
        xp, x = self.model.xp, layer._x
        rows, out = unit.row1 - unit.row0, layer.out
        region = buffer[at:at + unit.elems]
        W = region[:rows * out].reshape(rows, out)
        if unit.k == unit.slices - 1:
            self._dx = xp.empty_like(x) if need_dx else None
            xp.sum(dy, axis=0, out=region[rows * out:])
        if need_dx:  # written in place: a temporary of the slice's rows of dx would add to the peak
            xp.matmul(dy, W.T, out=self._dx[:, unit.row0:unit.row1])
        xp.matmul(x[:, unit.row0:unit.row1].T, dy, out=W)
        if unit.k > 0:
            return dy  # the slices before this one take the same output gradient
        dx, self._dx, layer._x = self._dx, None, None
        return dx
