"""The orders every server rank carries out: the coordinator's decisions as typed records.

Rank 0 runs the coordinator (``sync.coordinator``); what it decides on an event becomes one list of
orders (:class:`OrderList`, an executor of the coordinator's that makes records instead of acting).
Rank 0 carries the list out on its own shard and sends it, in the same order, to ranks 1..k-1
(``ORDER_TAG``), which carry it out on theirs through the same code (``runtime.servers.executor``): Horovod's
response list, which every rank, the coordinator's included, executes. A rejected push is an order
too, so no server works a decision out again from a push header.

Each order says all a server needs to carry it out without a policy: the push's iteration (checked
against the push's header), the version (the learning rate's), and for a reply whether the worker's
next push is its last. Nothing in this module calls MPI.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from ...sync.base import Record
from ...sync.coordinator import Coordinator, Executor
from ..transport.protocol import ProtocolError

#: an order message is rows of ORDER_WIDTH float64 (code, a, b, c): every integer exact below 2**53
ORDER_WIDTH = 4


class ApplyOrder(NamedTuple):
    """Apply `worker`'s push, its `iteration`-th, as one optimizer step at the learning rate of
    `version` (the version before it). Row: (1, worker, version, iteration)."""

    worker: int
    version: int
    iteration: int
    CODE = 1  # not a field: NamedTuple takes unannotated names as class attributes

    def rows(self) -> list[tuple]:
        return [(self.CODE, self.worker, self.version, self.iteration)]


class RejectOrder(NamedTuple):
    """`worker`'s `iteration`-th push held NaN or Inf (or, with one server, its delay-compensated step
    did): it is taken in and never applied. Row: (7, worker, iteration, 0)."""

    worker: int
    iteration: int
    CODE = 7

    def rows(self) -> list[tuple]:
        return [(self.CODE, self.worker, self.iteration, 0)]


class ReplyOrder(NamedTuple):
    """Answer `worker`'s pull with the weights of `version`; `stop`: its last reply; `last`: its next
    push will be its last (its iteration limit). Row: (4, worker, version, stop + 2 last)."""

    worker: int
    version: int
    stop: bool
    last: bool = False
    CODE = 4

    def rows(self) -> list[tuple]:
        return [(self.CODE, self.worker, self.version, int(self.stop) + 2 * int(self.last))]


class RoundOrder(NamedTuple):
    """BSP: the mean of `members`' pushes (worker order; member k's is its `iterations[k]`-th) as one
    step at the learning rate of `version`, then `replies` with the weights after it. Rows: (2,
    len(members), version, len(replies)), one (3, member, iteration, 0) per member, then the replies'."""

    members: tuple[int, ...]
    iterations: tuple[int, ...]
    version: int
    replies: tuple[ReplyOrder, ...]
    CODE = 2
    MEMBER = 3

    def rows(self) -> list[tuple]:
        return [(self.CODE, len(self.members), self.version, len(self.replies))] + \
            [(self.MEMBER, w, i, 0) for w, i in zip(self.members, self.iterations, strict=True)] + \
            [row for reply in self.replies for row in reply.rows()]


class SnapshotOrder(NamedTuple):
    """Send this shard's parameters (`with_velocity`: and the optimizer state) to rank 0 on
    ``SNAP_TAG``. Row: (5, 0, with_velocity, 0)."""

    with_velocity: bool
    CODE = 5

    def rows(self) -> list[tuple]:
        return [(self.CODE, 0, 1 if self.with_velocity else 0, 0)]


class EndOrder(NamedTuple):
    """Every worker has stopped: report the statistics and close. Row: (6, 0, 0, 0)."""

    CODE = 6

    def rows(self) -> list[tuple]:
        return [(self.CODE, 0, 0, 0)]


Order = ApplyOrder | RejectOrder | RoundOrder | ReplyOrder | SnapshotOrder | EndOrder


def encode_orders(orders: list[Order]) -> np.ndarray:
    """One message of `orders`: their rows, flat, float64."""
    return np.array([row for order in orders for row in order.rows()], dtype=np.float64).reshape(-1)


def decode_orders(values: np.ndarray) -> list[Order]:
    """The orders of one message (:func:`encode_orders`); a malformed message is a ProtocolError."""
    if values.size % ORDER_WIDTH:
        raise ProtocolError(f"orders of {values.size} values from rank 0 (not rows of {ORDER_WIDTH})")
    rows = [tuple(int(v) for v in row) for row in values.reshape(-1, ORDER_WIDTH)]
    orders: list[Order] = []
    i = 0
    while i < len(rows):
        order, i = _decode_one(rows, i)
        orders.append(order)
    return orders


def _decode_one(rows: list[tuple], i: int) -> tuple[Order, int]:
    """The order whose first row is ``rows[i]``, and the index of the row after it."""
    code, a, b, c = rows[i]
    i += 1
    if code == ApplyOrder.CODE:
        return ApplyOrder(a, b, c), i
    if code == RejectOrder.CODE:
        return RejectOrder(a, b), i
    if code == ReplyOrder.CODE:
        return _reply(rows[i - 1]), i
    if code == RoundOrder.CODE:
        members, replies = rows[i:i + a], rows[i + a:i + a + c]
        if len(members) < a or any(row[0] != RoundOrder.MEMBER for row in members):
            raise ProtocolError(f"a round of {a} members from rank 0 is followed by other rows: {members}")
        if len(replies) < c or any(row[0] != ReplyOrder.CODE for row in replies):
            raise ProtocolError(f"a round of {c} replies from rank 0 is followed by other rows: {replies}")
        return RoundOrder(tuple(m[1] for m in members), tuple(m[2] for m in members), b,
                          tuple(_reply(row) for row in replies)), i + a + c
    if code == SnapshotOrder.CODE:
        return SnapshotOrder(bool(b)), i
    if code == EndOrder.CODE:
        return EndOrder(), i
    raise ProtocolError(f"unknown order {rows[i - 1]} from rank 0")


def _reply(row: tuple) -> ReplyOrder:
    _, worker, version, flags = row
    return ReplyOrder(worker, version, bool(flags & 1), bool(flags & 2))


class OrderList(Executor):
    """The coordinator's decisions on one event as orders (:attr:`orders`, in order) and the policy's
    trace rows (:attr:`records`): what rank 0 carries out and sends to the other servers.

    Parameters
    ----------
    coordinator : Coordinator
        Read for the counts an order carries: a push's iteration, whether a reply's worker pushes
        its last next.
    """

    def __init__(self, coordinator: Coordinator):
        self.coordinator = coordinator
        self.orders: list[Order] = []
        self.records: list[Record] = []

    def apply(self, worker: int, version: int) -> None:
        # called before the push is counted: its iteration is the count so far
        self.orders.append(ApplyOrder(worker, version, self.coordinator.pushes[worker]))

    def reject(self, worker: int, iteration: int) -> None:
        self.orders.append(RejectOrder(worker, iteration))

    def reply(self, worker: int, version: int, stop: bool) -> None:
        self.orders.append(self._reply(worker, version, stop))

    def round(self, members: tuple[int, ...], version: int, released: list[tuple[int, bool]]) -> None:
        after = version + 1 if members else version
        # every member's push is counted: its iteration is one less than its count
        iterations = tuple(self.coordinator.pushes[w] - 1 for w in members)
        replies = tuple(self._reply(w, after, stop) for w, stop in released)
        self.orders.append(RoundOrder(members, iterations, version, replies))

    def record(self, record: Record) -> None:
        self.records.append(record)

    def _reply(self, worker: int, version: int, stop: bool) -> ReplyOrder:
        return ReplyOrder(worker, version, stop, not stop and self.coordinator.next_is_last(worker))
