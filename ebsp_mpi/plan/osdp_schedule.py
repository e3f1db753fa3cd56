"""How a worker runs an OSDP plan: its units, the order of its compute items, where each unit lies in
the one fetch buffer, and when each is fetched. Pure (no MPI, no arrays): the worker, the servers and
the tests all derive the same schedule from the plan file and the model.

A **unit** is what one fetch brings: a whole on-demand layer, or one slice of whole rows of it. Its
elements are one or two runs of the flat parameter buffer (a Dense slice's rows of W, with b on the
last slice; a Conv2D slice's output channels of W and of b), and it lies in the fetch buffer as
those runs back to back. The **items** are the iteration's compute steps in the order
:func:`ebsp_mpi.plan.osdp.items` times them (the prefix's forward; per block its forward, one item
per slice; per block in reverse its backward, last slice first), and units go alternately to the
front and the back of the buffer, so that an item's unit and the next one's never overlap: the
buffer is the largest pair of adjacent units, the plan's ``buffer_bytes``. The last block's last
unit serves its forward and its backward: it is *kept* (same place, no second fetch).
"""

from __future__ import annotations

from dataclasses import dataclass

from ..nn.layers import Conv2D, Dense
from .osdp_files import OsdpFileError


@dataclass(frozen=True)
class Unit:
    """What one fetch brings: block `block`'s slice `k` (of `slices`), rows [row0, row1) of its W.

    ``runs`` are ``(start, stop)`` ranges of the flat parameter buffer, in the order they lie in the
    fetch buffer; ``elems`` is their total, of which the first ``w_elems`` are W's rows (b's follow)."""

    block: int
    k: int
    slices: int
    row0: int
    row1: int
    runs: tuple[tuple[int, int], ...]
    w_elems: int

    @property
    def elems(self) -> int:
        return sum(b - a for a, b in self.runs)


@dataclass(frozen=True)
class Item:
    """One compute step: ``kind`` is ``"prefix"``, ``"forward"`` or ``"backward"``; ``block`` the block
    (None for the prefix); ``unit`` its unit's index (None when resident), at element ``at`` of the
    fetch buffer; ``kept``: the unit is the one the item before used, not fetched again."""

    kind: str
    block: int | None
    unit: int | None = None
    at: int = 0
    kept: bool = False

    @property
    def fetched(self) -> bool:
        return self.unit is not None and not self.kept


@dataclass(frozen=True)
class Schedule:
    """A plan as the worker runs it.

    Attributes
    ----------
    blocks : list of (first, stop)
        Per block, the model layers it spans: its layer with parameters and the parameter-free ones
        after it. ``prefix`` is the number of parameter-free layers before the first block.
    slices : list of int
        Per block, 0 when resident, else its slice count (1: a whole on-demand layer).
    units, items : lists of Unit and Item
    buffer_elems : int
        Elements of the fetch buffer.
    overlap : bool
        Fetch each unit while the item before computes (else when its item is reached).
    """

    prefix: int
    blocks: list[tuple[int, int]]
    slices: list[int]
    units: list[Unit]
    items: list[Item]
    buffer_elems: int
    overlap: bool

    def cuts(self) -> list[int]:
        """Every element offset where a unit's run starts or stops: the messages of a push must break
        there, so that a unit's gradient goes as whole messages of its own."""
        return sorted({x for u in self.units for run in u.runs for x in run})


def on_demand_tensors(plan: dict | None) -> frozenset:
    """The tensors of the plan's on-demand layers (none without a plan)."""
    if not plan:
        return frozenset()
    return frozenset(t for layer in plan["layers"] if layer["mode"] == "on-demand" for t in layer["tensors"])


def make_schedule(plan: dict, model, where: str = "osdp.plan") -> Schedule:
    """The schedule of `plan` (a checked plan file) on `model` (its ``space.view`` gives every tensor's
    place in the flat buffer, held or not).

    Raises
    ------
    OsdpFileError
        A layer that cannot be fetched on demand (one other than Dense and Conv2D), or a plan whose
        buffer is smaller than the units need.
    """
    layers = model.layers
    with_params = [i for i, layer in enumerate(layers) if layer.tensor_names]
    bounds = list(zip(with_params, with_params[1:] + [len(layers)], strict=True))
    slices, units = [], []
    for j, (entry, (first, _)) in enumerate(zip(plan["layers"], bounds, strict=True)):
        if entry["mode"] == "resident":
            slices.append(0)
            continue
        layer, s = layers[first], entry["slices"]
        if not isinstance(layer, (Dense, Conv2D)):
            raise OsdpFileError(f"{where}: layer {entry['name']} ({type(layer).__name__}) cannot be fetched on demand")
        slices.append(s)
        units += _units(j, layer, model.space, entry["slice_rows"])
    items = _items(len(bounds), slices, units)
    buffer, items = _place(items, units)
    planned = int(plan.get("buffer_bytes", 0))
    if buffer * 4 > planned:  # float32: the plan's buffer must hold every adjacent pair
        raise OsdpFileError(f"{where}: buffer_bytes = {planned}, but the units need {buffer * 4}; plan again")
    overlap = bool(plan.get("network", {}).get("overlap", False))
    return Schedule(prefix=with_params[0] if with_params else len(layers), blocks=bounds, slices=slices, units=units,
                    items=items, buffer_elems=buffer, overlap=overlap)


def _units(j: int, layer, space, slice_rows: list[int]) -> list[Unit]:
    """Block j's units, forward order: runs of W's rows and of b (with the last slice for a Dense,
    per row for a Conv2D)."""
    w, b = (space.view(name) for name in layer.tensor_names)
    per_row = w.size // w.shape[0]
    s, out, row = len(slice_rows), [], 0
    for k, n in enumerate(slice_rows):
        runs = [(w.offset + row * per_row, w.offset + (row + n) * per_row)]
        if isinstance(layer, Conv2D):
            runs.append((b.offset + row, b.offset + row + n))
        elif k == s - 1:
            runs.append((b.offset, b.offset + b.size))
        out.append(Unit(j, k, s, row, row + n, merge_runs(runs), n * per_row))
        row += n
    return out


def merge_runs(runs: list[tuple[int, int]]) -> tuple[tuple[int, int], ...]:
    """Adjacent ``(start, stop)`` runs as one (a Dense's W end is its b's start: a whole layer is one
    run; a server's chunks of a unit are one run or two)."""
    merged: list[tuple[int, int]] = []
    for a, b in runs:
        if merged and a == merged[-1][1]:
            merged[-1] = (merged[-1][0], b)
        else:
            merged.append((a, b))
    return tuple(merged)


def _items(blocks: int, slices: list[int], units: list[Unit]) -> list[Item]:
    """The items in order, each with its unit's index (placed later)."""
    index = {(u.block, u.k): i for i, u in enumerate(units)}
    items = [Item("prefix", None)]
    for j in range(blocks):
        s = slices[j]
        items += [Item("forward", j)] if s == 0 else [Item("forward", j, index[j, k]) for k in range(s)]
    for j in reversed(range(blocks)):
        s = slices[j]
        if s == 0:
            items.append(Item("backward", j))
            continue
        for k in reversed(range(s)):
            kept = j == blocks - 1 and k == s - 1
            items.append(Item("backward", j, index[j, k], kept=kept))
    return items


def _place(items: list[Item], units: list[Unit]) -> tuple[int, list[Item]]:
    """The buffer's size (the largest adjacent pair of units, a kept unit counted once) and each item
    with its unit at the front or the back of it, alternately."""
    size = [units[it.unit].elems if it.unit is not None else 0 for it in items]
    nxt = [0 if it.kept else n for it, n in zip(items[1:], size[1:], strict=True)] + [0]
    buffer = max(a + b for a, b in zip(size, nxt, strict=True))
    placed, next_front, last = [], True, (0, True)
    for it, n in zip(items, size, strict=True):
        if it.unit is None:
            placed.append(it)
            continue
        if it.kept:  # where its forward left it
            at, front = last
        else:
            front = next_front
            at = 0 if front else buffer - n
        placed.append(Item(it.kind, it.block, it.unit, at, it.kept))
        last, next_front = (at, front), not front
    return buffer, placed
