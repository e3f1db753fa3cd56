"""OSDP's planner: per layer, keep the weights resident on the worker, fetch them on demand, or fetch
them on demand in s slices, so that samples per second are highest under a per-worker memory limit.

OSDP (Jiang et al., IJCAI 2023) chooses per operator between replicated parameters and sharded ones
gathered just in time, and splits large operators. Here the servers hold the shards, so "sharded" is
*on-demand*: the worker pulls a layer's weights just before its forward, drops them, pulls them again
just before its backward and drops them once its gradient is pushed. This module is the cost model
and an exact search over it: pure (no MPI, no arrays), from a profile (:mod:`ebsp_mpi.plan_cli.profile`).

Blocks and choices
------------------
A **block** is one layer with parameters (``Dense``, ``Conv2D``) and the parameter-free layers after it
(ReLU, pooling, Flatten); parameter-free layers before the first one form the *prefix*. Per block the
plan holds an int ``s``: ``0`` **resident**, ``1`` **on-demand**, ``s >= 2`` **on-demand in s slices**.

A slice is a run of whole rows of the layer's weight, contiguous in the ``ParamSpace`` so that it
travels as one message with no packing: a ``Dense`` W ``(in, out)`` is cut along ``in`` (its forward
adds the s partial products ``x[:, rows] @ W[rows]``, its backward writes ``dW[rows]`` and
``dx[:, rows]`` slice by slice; ``b`` travels with the last slice), a ``Conv2D`` W ``(O, C, kh, kw)``
along ``O`` (each slice computes its own output channels, with its ``b[o]``). Rows are dealt as
``numpy.array_split`` does: the first ``rows mod s`` slices get one row more. ``s`` comes from
``splits`` (default :data:`SPLITS` = 2, 4, 8), at most the layer's rows: powers of two because each
halves the largest slice, which is what sets the worker's buffers, while s + 1 over s adds a message
per slice and pass for a smaller saving; beyond 8 the per-slice latency (2 passes x s fetches) and
thinner GEMMs cost more than the last eighth of a buffer saves on the models here. Other lists can be
given.

Memory: what the worker holds, in bytes (``item`` = 4 for float32, b = batch)
----------------------------------------------------------------------------
An iteration is a chain of compute *items* (below); an on-demand item computes with its *unit* (a
whole on-demand layer, or one slice) present in a buffer, and while item k computes, the unit of item
k + 1 is fetched into another::

    peak = Σ_resident 2·w_l           weights + gradient of each resident layer (its ParamSpace part)
         + max_k (u_k + u_(k+1))      the fetch buffer: u_k = bytes of item k's unit (0 if resident),
                                      the unit in use and the one prefetched for the next item
         + max_split b·out_l·item     a split Dense adds its s partial products into its output: one
                                      temporary of the output (Conv2D slices write their own channels)
         + max_on-demand b·in_l·item  an on-demand Dense computes its input gradient before dW (below),
                                      so both its input and its input gradient are held (not for the
                                      first layer, which computes none; a Conv2D's column buffers are
                                      kept between steps whatever the order: nothing more)
         + A(b)                       activations and temporaries of one forward + backward at batch
                                      b, the minibatch included: measured by the profile (tracemalloc
                                      on NumPy, the memory pool on CuPy)

with ``w_l = params_l · item``. In backward, an on-demand unit needs no second buffer for its
gradient: the input gradient is computed first (it reads W), then ``dW`` is written over W in the
same buffer and pushed, and the worker waits for that push before the next item, which frees the
buffer. One preallocated buffer of ``max_k (u_k + u_(k+1))`` bytes holds every unit when the units
go alternately to its front and its back end (two units are present together only when adjacent),
so nonblocking MPI runs on fixed memory and the peak does not depend on the allocator. Host staging
mirrors on a GPU are host memory, not device memory, and add nothing; on NumPy MPI reads and writes
the buffer and the resident ``ParamSpace`` directly. The parts may peak at different moments, so the
sum is an upper bound (the buffer dominates on the models where a plan matters). Not counted: the
data set, the process, MPI's own buffers (the same for every plan; a run reports its peak above the
baseline before the model was built).

Time of one iteration of one worker (L: one-way latency, β: bandwidth in bytes/s)
--------------------------------------------------------------------------------
The items, in order: the prefix's forward; per block in forward order its forward (one item if resident,
else one per slice; its parameter-free layers join the last one, and the loss joins the last block's);
per block in backward order its backward (resident: one item; else one per slice, last slice first, the
parameter-free layers joining the first). Times come from the profile; a slice takes 1/s of its layer's
time in s slices, which the profile measures per slice count (a Conv2D's slices each add their part of
the column gradient onto dx, so s slices cost more than the layer). The last block's last unit serves
its forward and, after the loss, its backward: it is kept between the two, not fetched again (nothing
runs between them to free it for).

On one node MPI's large messages are copied by the rank that receives them (the sender may compute
meanwhile), and the server has a core of its own: so the gradients a worker pushes of its resident
layers, one after another as its backward writes them (Poseidon's WFBP), cost it nothing but the last,
while the weights it fetches are copied by its own core. With ``overlap`` (a GPU computes while the
host receives) a fetch proceeds while the item before computes::

    round       = max(update, L + R/β)    the servers' optimizer step over every parameter (each its
                                          shard), between the last push and the pull reply; each
                                          chunk of the resident weights R goes out as soon as it is
                                          updated, so the worker copies chunk k while the server
                                          updates chunk k + 1, and the slower of the two sets the end
    fetch(u)    = 2L + bytes(u)/β          request + reply, issued when the item before starts
    push(u)     = L + bytes(u)/β           an on-demand unit's gradient, waited for at its end
    iteration   = round + Σ_k compute_k + Σ_on-demand k max(0, fetch(u_k) − ran_(k−1))
                + Σ_on-demand backward items push(u_k)      (ran_k = compute_k + its push, if any)
                + L + (w_0/β if block 0 is resident)      the last resident push
                + overhead                                a constant per iteration from the profile

Without overlap (NumPy: the worker's own core receives what it fetches) every fetch is waited for:
``max(0, fetch − ran)`` becomes ``fetch``. ``update`` is profiled (:mod:`ebsp_mpi.plan_cli.profile`); the mean
of the round's gradients under BSP adds a pass per further worker, which the overhead counts.

Both the peak's buffer term and the waits are sums or maxima of terms over **adjacent items**, and
adjacent items belong to the same block or to adjacent blocks: this is what makes an exact dynamic
programme possible. :func:`simulate` and :func:`memory` instead run the chain item by item (the
test oracle's model, written independently of the programme).

Search
------
:func:`plan` maximises ``b / iteration`` over the allowed batch sizes, subject to ``peak <= limit``.
For each batch size a dynamic programme runs over the blocks in order; its state is the previous
block's choice (all a later block's terms depend on), and each state keeps the **Pareto front** of
labels (resident bytes, largest buffer term, split temporary, input gradient, time so far), pruned by
dominance. Memory stays in whole bytes: no discretisation, so the search is exact. :func:`plan_brute`
tries every combination: the test oracle. A limit below every plan raises :class:`Infeasible`, which
carries the plan with the smallest peak.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass

#: Allowed slice counts of a split layer (besides 1, a whole on-demand layer).
SPLITS = (2, 4, 8)
RESIDENT, ON_DEMAND = 0, 1


def split_rows(rows: int, s: int) -> tuple[int, ...]:
    """`rows` dealt into `s` slices as ``numpy.array_split`` deals them: the first ``rows mod s`` get
    one row more."""
    q, r = divmod(rows, s)
    return (q + 1,) * r + (q,) * (s - r)


@dataclass(frozen=True)
class Block:
    """One layer with parameters, its slicing, and the times of it and its parameter-free layers.

    Attributes
    ----------
    name : str
        The layer's tensor prefix, ``"dense2"``.
    rows, row_elems : int
        Rows of W along the split axis (Dense: ``in``, Conv2D: ``O``) and elements per row.
    bias_elems : int
        Elements of ``b``.
    bias_per_row : bool
        ``b`` has one element per row (Conv2D: with its channel's slice); else it travels with the
        last slice (Dense).
    split_temp_elems : int
        Elements per sample of the temporary a split needs (Dense: its output; Conv2D: 0).
    input_grad_elems : int
        Elements per sample that the layer on demand holds beyond a resident step: its input gradient,
        computed while its input is still held (Dense: its input width; Conv2D: 0).
    forward_s, backward_s : float
        Seconds of the layer's forward and backward at this batch size.
    after_forward_s, after_backward_s : float
        Seconds of the parameter-free layers that follow it.
    split_s : tuple of (s, forward, backward)
        Seconds of the layer's forward and backward run in s slices (all s of them), per slice count
        profiled; a count not listed takes the layer's own times.
    """

    name: str
    rows: int
    row_elems: int
    bias_elems: int
    bias_per_row: bool
    split_temp_elems: int
    input_grad_elems: int
    forward_s: float
    backward_s: float
    after_forward_s: float = 0.0
    after_backward_s: float = 0.0
    split_s: tuple[tuple[int, float, float], ...] = ()

    @property
    def params(self) -> int:
        return self.rows * self.row_elems + self.bias_elems

    def seconds(self, s: int) -> tuple[float, float]:
        """Forward and backward seconds of the layer under choice `s` (all its slices together)."""
        for n, forward, backward in self.split_s:
            if n == s:
                return forward, backward
        return self.forward_s, self.backward_s

    def slice_rows(self, s: int) -> tuple[int, ...]:
        """Rows of each of the `s` slices in forward order (:func:`split_rows`)."""
        if not 1 <= s <= self.rows:
            raise ValueError(f"{self.name}: cannot split {self.rows} rows in {s} slices")
        return split_rows(self.rows, s)

    def slice_elems(self, s: int) -> tuple[int, ...]:
        """Elements of each of the `s` slices (``s = 1``: the whole layer), in forward order."""
        rows = self.slice_rows(s)
        if self.bias_per_row:
            return tuple(n * (self.row_elems + 1) for n in rows)
        return tuple(n * self.row_elems + (self.bias_elems if k == s - 1 else 0) for k, n in enumerate(rows))


@dataclass(frozen=True)
class CostModel:
    """Everything the planner needs for one batch size.

    Attributes
    ----------
    batch : int
        Samples per iteration of one worker.
    blocks : tuple of Block
        In forward order.
    prefix_s, loss_s : float
        Forward of the parameter-free layers before the first block; softmax cross-entropy.
    activation_bytes : int
        A(b): activations and temporaries of one step, the minibatch included.
    latency_s, bandwidth : float
        One-way latency (s) and bandwidth (bytes/s) between a worker and the server.
    itemsize : int
        Bytes per parameter (4: float32).
    overhead_s : float
        Seconds added to every iteration (what the chain does not see: the server, the barrier).
    overlap : bool
        A fetch proceeds while the device computes (a GPU, while the host receives). False where the
        worker's compute waits for it (NumPy over shared-memory MPI: the receiving core copies).
    update_s : float
        Seconds of the servers' optimizer step over every parameter (each server its shard).
    """

    batch: int
    blocks: tuple[Block, ...]
    prefix_s: float
    loss_s: float
    activation_bytes: int
    latency_s: float
    bandwidth: float
    itemsize: int = 4
    overhead_s: float = 0.0
    overlap: bool = True
    update_s: float = 0.0

    def weight_bytes(self, block: Block) -> int:
        return block.params * self.itemsize

    def input_grad_bytes(self, i: int) -> int:
        """What block `i` on demand holds beyond ``A(b)``: its input gradient beside its input (0 for
        the first block, which computes none)."""
        return self.batch * self.blocks[i].input_grad_elems * self.itemsize if i else 0

    def unit_bytes(self, block: Block, s: int) -> tuple[int, ...]:
        return tuple(n * self.itemsize for n in block.slice_elems(s))

    def fetch_s(self, nbytes: int) -> float:
        """One on-demand fetch: a request, then the reply."""
        return 2 * self.latency_s + nbytes / self.bandwidth

    def push_s(self, nbytes: int) -> float:
        return self.latency_s + nbytes / self.bandwidth

    def round_s(self, resident: int) -> float:
        """From the last push to the pull reply: the update, and the pull of the `resident` bytes
        chunk by chunk behind it."""
        return max(self.update_s, self.push_s(resident))

    def last_push_s(self, choices: Sequence[int]) -> float:
        """The last resident push, block 0's (its header alone when block 0 is on demand)."""
        return self.push_s(self.weight_bytes(self.blocks[0]) if choices[0] == RESIDENT else 0)


@dataclass(frozen=True)
class Item:
    """One compute step of the chain: its seconds, the bytes of its on-demand unit (0: resident), and
    whether its unit is the one the item before used, kept rather than fetched again."""

    seconds: float
    unit: int
    backward: bool
    kept: bool = False


@dataclass(frozen=True)
class Memory:
    """A plan's peak, by part (bytes); ``total`` is what must stay under the limit."""

    resident: int
    buffer: int
    split_temp: int
    input_grad: int
    activations: int

    @property
    def total(self) -> int:
        return self.resident + self.buffer + self.split_temp + self.input_grad + self.activations


@dataclass(frozen=True)
class Plan:
    """A choice per block at one batch size, and its predicted peak memory and iteration time."""

    batch: int
    choices: tuple[int, ...]
    memory: Memory
    iteration_s: float

    @property
    def samples_per_s(self) -> float:
        return self.batch / self.iteration_s

    @property
    def peak_bytes(self) -> int:
        return self.memory.total


class Infeasible(ValueError):
    """No plan fits under the limit; ``smallest`` is the plan that needs least memory."""

    def __init__(self, limit: int, smallest: Plan):
        self.limit, self.smallest = limit, smallest
        super().__init__(f"no plan fits in {limit} bytes; the smallest needs {smallest.peak_bytes} bytes")


def choices_of(block: Block, splits: Sequence[int] = SPLITS) -> tuple[int, ...]:
    """The choices a block allows: resident, on-demand, and each split count up to its rows."""
    return (RESIDENT, ON_DEMAND) + tuple(s for s in sorted(set(splits)) if 2 <= s <= block.rows)


def describe(s: int) -> str:
    return "resident" if s == RESIDENT else "on-demand" if s == ON_DEMAND else f"split {s}"


def category(choices: Sequence[int]) -> str:
    """``all-resident``, ``mixed`` (resident and on-demand, no split), ``all-on-demand`` (no split) or
    ``split`` (at least one layer in slices)."""
    if any(s >= 2 for s in choices):
        return "split"
    if all(s == RESIDENT for s in choices):
        return "all-resident"
    return "all-on-demand" if all(s == ON_DEMAND for s in choices) else "mixed"


# -- the model of one plan, item by item ---------------------------------------------------------


def block_items(cm: CostModel, i: int, s: int) -> tuple[list[Item], list[Item]]:
    """Block i's forward items and backward items (in the order they run) under choice s."""
    block = cm.blocks[i]
    after = block.after_forward_s + (cm.loss_s if i == len(cm.blocks) - 1 else 0.0)
    if s == RESIDENT:
        return ([Item(block.forward_s + after, 0, False)],
                [Item(block.after_backward_s + block.backward_s, 0, True)])
    units, last = cm.unit_bytes(block, s), i == len(cm.blocks) - 1
    f, b = block.seconds(s)
    forward = [Item(f / s + (after if k == s - 1 else 0.0), n, False) for k, n in enumerate(units)]
    # the last block's last slice serves its forward and at once its backward: kept, not fetched again
    backward = [Item(b / s + (block.after_backward_s if k == s - 1 else 0.0), units[k], True,
                     kept=last and k == s - 1) for k in reversed(range(s))]
    return forward, backward


def items(cm: CostModel, choices: Sequence[int]) -> list[Item]:
    """The iteration's compute items in order (see the module docstring)."""
    per = [block_items(cm, i, s) for i, s in enumerate(choices)]
    out = [Item(cm.prefix_s, 0, False)]
    for forward, _ in per:
        out += forward
    for _, backward in reversed(per):
        out += backward
    return out


def _resident_bytes(cm: CostModel, choices: Sequence[int]) -> int:
    return sum(cm.weight_bytes(b) for b, s in zip(cm.blocks, choices, strict=True) if s == RESIDENT)


def memory(cm: CostModel, choices: Sequence[int]) -> Memory:
    """The peak of a plan, by part, scanning the chain for the largest pair of adjacent units."""
    chain = items(cm, choices)
    buffer = max(a.unit + (0 if b.kept else b.unit) for a, b in itertools.pairwise([*chain, Item(0.0, 0, True)]))
    temp = max([cm.batch * b.split_temp_elems * cm.itemsize
                for b, s in zip(cm.blocks, choices, strict=True) if s >= 2], default=0)
    dx = max([cm.input_grad_bytes(i) for i, s in enumerate(choices) if s != RESIDENT], default=0)
    return Memory(2 * _resident_bytes(cm, choices), buffer, temp, dx, cm.activation_bytes)


def simulate(cm: CostModel, choices: Sequence[int]) -> float:
    """Seconds of one iteration: the chain run item by item, each fetch issued when the item before
    starts (or, without overlap, when it ends) and each on-demand gradient's push waited for."""
    t = cm.round_s(_resident_bytes(cm, choices))  # the round before, its pull reply
    before = t  # start of the item before
    for item in items(cm, choices):
        start = t
        if item.unit and not item.kept:
            issued = before if cm.overlap else t
            start = max(t, issued + cm.fetch_s(item.unit))
        before, t = start, start + item.seconds + (cm.push_s(item.unit) if item.unit and item.backward else 0.0)
    return t + cm.last_push_s(choices) + cm.overhead_s  # the resident pushes overlap all but the last


def evaluate(cm: CostModel, choices: Sequence[int]) -> Plan:
    choices = tuple(choices)
    return Plan(cm.batch, choices, memory(cm, choices), simulate(cm, choices))


def all_resident(cm: CostModel) -> Plan:
    return evaluate(cm, (RESIDENT,) * len(cm.blocks))


# -- exact search ---------------------------------------------------------------------------------


class _Terms:
    """The terms of a plan's time and buffer, by block and by pair of adjacent blocks."""

    def __init__(self, cm: CostModel):
        self.cm = cm
        self._items: dict[tuple[int, int], tuple[list[Item], list[Item]]] = {}

    def items(self, i: int, s: int) -> tuple[list[Item], list[Item]]:
        if (i, s) not in self._items:
            self._items[i, s] = block_items(self.cm, i, s)
        return self._items[i, s]

    def links(self, chain: list[Item]) -> tuple[float, int]:
        """Over consecutive items of `chain`: the waits of all but the first, and the largest buffer
        term (an item's unit + the next one's) of all but the last."""
        cm, wait, buffer = self.cm, 0.0, 0
        for before, item in itertools.pairwise(chain):
            buffer = max(buffer, before.unit + (0 if item.kept else item.unit))
            if item.unit and not item.kept:
                fetch = cm.fetch_s(item.unit)
                if cm.overlap:
                    ran = before.seconds + (cm.push_s(before.unit) if before.unit and before.backward else 0.0)
                    wait += max(0.0, fetch - ran)
                else:
                    wait += fetch
        return wait, buffer

    def own(self, i: int, s: int) -> float:
        """Block i's terms that do not depend on its neighbours: its pushes (a resident one only if it
        is the last, block 0's), and what its slices compute beyond the layer's own time (the constant
        counts that). Its share of the pull is in :meth:`CostModel.round_s`, of the resident bytes."""
        cm, block = self.cm, self.cm.blocks[i]
        if s != RESIDENT:
            extra = sum(block.seconds(s)) - block.forward_s - block.backward_s
            return extra + sum(cm.push_s(n) for n in cm.unit_bytes(block, s))
        return cm.weight_bytes(block) / cm.bandwidth if i == 0 else 0.0

    def step(self, i: int, a: int | None, s: int) -> tuple[float, int]:
        """Block i with choice s after block i − 1 with choice a (None: i = 0): the waits and buffer
        terms of block i's items and of the links between the two blocks, and i's own transfers."""
        forward, backward = self.items(i, s)
        if a is None:
            before = [Item(self.cm.prefix_s, 0, False)]
            wf, bf = self.links(before + forward)
            wb, bb = self.links(backward)
            bb = max(bb, backward[-1].unit)  # the last item of the iteration: nothing prefetched
        else:
            prev_forward, prev_backward = self.items(i - 1, a)
            wf, bf = self.links(prev_forward[-1:] + forward)
            wb, bb = self.links(backward + prev_backward[:1])
        return wf + wb + self.own(i, s), max(bf, bb)

    def turn(self, s: int) -> tuple[float, int]:
        """The last block's last forward item followed by its first backward item."""
        forward, backward = self.items(len(self.cm.blocks) - 1, s)
        return self.links(forward[-1:] + backward[:1])

    def constant(self) -> float:
        """Compute of every item, the latency of the last push, and the overhead."""
        cm = self.cm
        compute = cm.prefix_s + cm.loss_s + sum(b.forward_s + b.after_forward_s + b.after_backward_s + b.backward_s
                                                for b in cm.blocks)
        return compute + cm.latency_s + cm.overhead_s


@dataclass(frozen=True)
class _Label:
    resident: int
    buffer: int
    temp: int
    dx: int
    time: float
    choices: tuple[int, ...]

    def dominates(self, other: _Label) -> bool:
        return (self.resident <= other.resident and self.buffer <= other.buffer and self.temp <= other.temp
                and self.dx <= other.dx and self.time <= other.time)


def _pareto(labels: list[_Label]) -> list[_Label]:
    """The labels no other label dominates (of equal ones, the first)."""
    labels = sorted(labels, key=lambda a: (a.time, a.resident, a.buffer, a.temp, a.dx))
    kept: list[_Label] = []
    for a in labels:
        if not any(k.dominates(a) for k in kept):
            kept.append(a)
    return kept


def front(cm: CostModel, splits: Sequence[int] = SPLITS, limit: int | None = None) -> list[Plan]:
    """The plans at this batch size that no other beats in both peak memory and time, least memory
    first, by dynamic programming over the blocks; with `limit`, only those that fit.
    """
    terms, fixed = _Terms(cm), cm.activation_bytes
    states: dict[int | None, list[_Label]] = {None: [_Label(0, 0, 0, 0, 0.0, ())]}
    for i, block in enumerate(cm.blocks):
        grown: dict[int | None, list[_Label]] = {}
        w, temp = 2 * cm.weight_bytes(block), cm.batch * block.split_temp_elems * cm.itemsize
        dx = cm.input_grad_bytes(i)
        for a, labels in states.items():
            for s in choices_of(block, splits):
                time, buffer = terms.step(i, a, s)
                for lab in labels:
                    b = _Label(lab.resident + (w if s == RESIDENT else 0), max(lab.buffer, buffer),
                               max(lab.temp, temp) if s >= 2 else lab.temp,
                               lab.dx if s == RESIDENT else max(lab.dx, dx), lab.time + time, lab.choices + (s,))
                    if limit is None or b.resident + b.buffer + b.temp + b.dx + fixed <= limit:
                        grown.setdefault(s, []).append(b)
        states = {s: _pareto(labels) for s, labels in grown.items()}
    constant = terms.constant()
    plans = []
    for s, labels in states.items():
        wait, buffer = terms.turn(s)
        for lab in labels:
            m = Memory(lab.resident, max(lab.buffer, buffer), lab.temp, lab.dx, fixed)
            if limit is None or m.total <= limit:
                # the round grows with the resident bytes: the front keeps no label with more of them
                # and more time, so adding it here loses no plan
                rounds = cm.round_s(lab.resident // 2)
                plans.append(Plan(cm.batch, lab.choices, m, constant + lab.time + wait + rounds))
    plans.sort(key=lambda p: (p.peak_bytes, p.iteration_s))
    out: list[Plan] = []
    for p in plans:  # least memory first: keep each plan faster than every smaller one
        if not out or p.iteration_s < out[-1].iteration_s:
            out.append(p)
    return out


def _best(plans: list[Plan]) -> Plan:
    """Most samples per second; of equal ones, the least memory."""
    return max(plans, key=lambda p: (p.samples_per_s, -p.peak_bytes))


def plan(models: Sequence[CostModel], limit: int, splits: Sequence[int] = SPLITS) -> Plan:
    """The plan of most samples per second over the batch sizes of `models` with ``peak <= limit``.

    Raises
    ------
    Infeasible
        When no plan at any batch size fits; it carries the plan with the smallest peak.
    """
    fits = [p for cm in models for p in front(cm, splits, limit)]
    if fits:
        return _best(fits)
    smallest = min((front(cm, splits)[0] for cm in models), key=lambda p: (p.peak_bytes, -p.samples_per_s))
    raise Infeasible(limit, smallest)


def plan_brute(models: Sequence[CostModel], limit: int, splits: Sequence[int] = SPLITS) -> Plan:
    """:func:`plan` by trying every combination of choices, each run item by item (the test oracle)."""
    every = [evaluate(cm, c) for cm in models
             for c in itertools.product(*(choices_of(b, splits) for b in cm.blocks))]
    fits = [p for p in every if p.peak_bytes <= limit]
    if fits:
        return _best(fits)
    raise Infeasible(limit, min(every, key=lambda p: (p.peak_bytes, -p.samples_per_s)))


def combinations(models: Sequence[CostModel], splits: Sequence[int] = SPLITS) -> int:
    """How many plans brute force would try."""
    return sum(math.prod(len(choices_of(b, splits)) for b in cm.blocks) for cm in models)
