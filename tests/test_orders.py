"""The orders (``runtime.servers.orders``) and their executor (``runtime.servers.executor``), without MPI: what rank 0
decides becomes one order list, which every server rank carries out through the same code."""

import numpy as np
import pytest

from ebsp_mpi.config import SyncConfig
from ebsp_mpi.runtime.servers.executor import OrderExecutor
from ebsp_mpi.runtime.servers.orders import (ApplyOrder, EndOrder, OrderList, RejectOrder, ReplyOrder, RoundOrder,
                                     SnapshotOrder, decode_orders, encode_orders)
from ebsp_mpi.runtime.transport.protocol import ProtocolError
from ebsp_mpi.sync.coordinator import Coordinator
from ebsp_mpi.sync.registry import make_policy


def test_orders_round_trip_through_their_encoding():
    round_ = RoundOrder((0, 2, 5), (7, 7, 6), 17, (ReplyOrder(0, 18, False, True), ReplyOrder(2, 18, True)))
    orders = [ApplyOrder(3, 2**40, 9), RejectOrder(4, 12), round_, RoundOrder((), (), 18, ()),
              ReplyOrder(1, 5, True), ReplyOrder(4, 6, False, True), SnapshotOrder(True), EndOrder()]
    values = encode_orders(orders)
    # a round's members and replies: a row each
    assert values.dtype == np.float64 and values.size == 4 * (len(orders) + 3 + 2)
    assert decode_orders(values) == orders


@pytest.mark.parametrize("rows, message", [
    ([(9, 0, 0, 0)], "unknown order"),
    ([(2, 2, 7, 0), (3, 0, 0, 0)], "round of 2 members"),
    ([(2, 1, 7, 0), (4, 0, 0, 0)], "round of 1 members"),
    ([(2, 1, 7, 1), (3, 0, 0, 0), (1, 0, 0, 0)], "round of 1 replies"),
])
def test_a_malformed_order_message_is_a_protocol_error(rows, message):
    with pytest.raises(ProtocolError, match=message):
        decode_orders(np.array(rows, dtype=np.float64).reshape(-1))
    with pytest.raises(ProtocolError, match="not rows of 4"):
        decode_orders(np.zeros(3))


def decide(c: Coordinator, w: int, t: float, rejected: bool = False) -> list:
    decided = OrderList(c)
    c.push_to(decided, w, t, rejected)
    return decided.orders


def test_a_rejected_push_is_an_order_and_every_order_carries_its_push_iteration():
    """The order list says what the other servers once worked out again from the push header: which
    push is rejected, each push's iteration, whether a reply's worker pushes its last next."""
    c = Coordinator(make_policy(SyncConfig(model="bsp"), 2), [3, 3])
    c.start_to(OrderList(c), 0.0)
    assert decide(c, 0, 1.0, rejected=True) == [RejectOrder(0, 0)]
    assert decide(c, 1, 2.0) == [RoundOrder((1,), (0,), 0, (ReplyOrder(0, 1, False), ReplyOrder(1, 1, False)))]
    decide(c, 0, 3.0)
    # both have pushed twice: the next push is their last
    assert decide(c, 1, 4.0) == [RoundOrder((0, 1), (1, 1), 1, (ReplyOrder(0, 2, False, True),
                                                               ReplyOrder(1, 2, False, True)))]
    asp = Coordinator(make_policy(SyncConfig(model="asp"), 2), [None, None])
    asp.start_to(OrderList(asp), 0.0)
    decide(asp, 1, 1.0)
    assert decide(asp, 1, 2.0) == [ApplyOrder(1, 1, 1), ReplyOrder(1, 2, False)]


def test_the_coordinator_reads_the_policys_push_counts_which_a_restore_keeps():
    policy = make_policy(SyncConfig(model="ssp", staleness=2), 2)
    c = Coordinator(policy, [None, None])
    c.start_to(OrderList(c), 0.0)
    decide(c, 0, 1.0)
    assert c.pushes is policy.push_counts and c.pushes == [1, 0]
    fresh = make_policy(SyncConfig(model="ssp", staleness=2), 2)
    resumed = Coordinator(fresh, [None, None])
    resumed.restore(1, [1, 0], 0, policy.state_dict())
    assert resumed.pushes is fresh.push_counts and resumed.pushes == [1, 0]
    with pytest.raises(ValueError, match="disagree"):
        Coordinator(make_policy(SyncConfig(model="ssp", staleness=2), 2), [None, None]).restore(
            1, [0, 1], 0, policy.state_dict())


class FakeStore:
    """What the executor asks of a shard, recorded: no MPI, no weights."""

    def __init__(self, n: int, headers: dict | None = None):
        self.n, self.stream, self.params = n, None, np.zeros(1)
        self.headers = headers or {}  # (worker, iteration) -> finite
        self.done: list[tuple] = []

    def rejected(self, w, iteration):
        if (w, iteration) not in self.headers:
            raise ProtocolError(f"push from worker {w}: not iteration {iteration}")
        return not self.headers[w, iteration]

    def apply(self, w, version):
        self.done.append(("apply", w, version))

    def reply_buffer(self):
        return self.params

    def reply(self, w, buffer, stop, head, sent, last):
        self.done.append(("reply", w, stop, last))


def test_an_order_waits_for_its_push_and_a_rejection_is_taken_in_never_applied():
    store = FakeStore(2, {(0, 0): True, (1, 0): False})
    executor = OrderExecutor(store)
    executor.take([ReplyOrder(0, 0, False), ReplyOrder(1, 0, False, True)])
    assert executor.carry_out() and store.done == [("reply", 0, False, False), ("reply", 1, False, True)]
    store.done.clear()
    executor.take([RejectOrder(1, 0), ReplyOrder(1, 0, False), ApplyOrder(0, 0, 0), ReplyOrder(0, 1, False)])
    assert not executor.carry_out()  # worker 1's push is not here yet: nothing is carried out
    executor.arrived([0])
    assert not executor.carry_out()  # still at the head: worker 1's rejection
    executor.arrived([1])
    assert executor.carry_out() and not executor.queue
    assert store.done == [("reply", 1, False, False), ("apply", 0, 0), ("reply", 0, False, False)]


def test_an_order_that_disagrees_with_the_push_header_is_a_protocol_error():
    store = FakeStore(1, {(0, 0): False})
    executor = OrderExecutor(store)
    executor.take([ReplyOrder(0, 0, False), ApplyOrder(0, 0, 0)])
    executor.arrived([0])
    with pytest.raises(ProtocolError, match="holds NaN or Inf"):
        executor.carry_out()
    executor = OrderExecutor(FakeStore(1, {(0, 0): True}))
    executor.take([ReplyOrder(0, 0, False), ReplyOrder(0, 0, False)])
    executor.arrived([0])
    with pytest.raises(ProtocolError, match="before its push was taken in"):
        executor.carry_out()
