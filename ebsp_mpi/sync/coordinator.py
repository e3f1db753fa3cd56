"""The coordinator: what rank 0 decides on each event, written once (docs/design.md, "The coordinator").

A :class:`Coordinator` wraps a sync policy and owns everything the parameter server decides: the
version count, the rejected pushes, BSP's round, the iteration limits and the workers that have
left, and the stop (a time limit, or a stop request on SIGTERM); every worker's push count is the
policy's (``SyncPolicy.push_counts``), read here, not kept twice. It is
pure: no MPI, no arrays, no clock of its own. Given an event it returns the **actions** to carry out,
in order:

- :class:`Apply` -- apply this worker's push as one optimizer step (at the learning rate of
  ``version``); the version count then goes up by one;
- :class:`Reject` -- this push held NaN or Inf: it is counted and never applied;
- :class:`Round` -- BSP: close the round with these members (the mean of their pushes as one step;
  no step when every push of the round was rejected), then send these replies;
- :class:`Reply` -- answer this worker's pull with the weights of ``version``; with ``stop`` it is the
  worker's last reply;
- :class:`~ebsp_mpi.sync.base.Record` -- a trace row of the policy's (a barrier, a ZipLine call).

The drivers carry the actions out and decide nothing: the MPI servers take them as one list of
typed orders that every server rank, rank 0 included, carries out through the same executor
(``runtime/servers/orders.py``, ``runtime/servers/executor.py``); the event simulator (:mod:`ebsp_mpi.sim.events`),
which makes millions of pushes, is an :class:`Executor` whose methods the coordinator calls in the
same order, with no record made (:meth:`Coordinator.push_to`); so is the server's order list. The
single-process reference trainer does not use it: it is the oracle the MPI runs are checked against.

Events: :meth:`~Coordinator.start` (every worker pulls the initial weights),
:meth:`~Coordinator.push` (worker w's push at time t, which is also its request to pull: a worker
asks for its next weights by pushing) and :meth:`~Coordinator.request_stop` (stop every worker at
its next pull). A worker leaves after its last push (its iteration limit) or at a stop reply; each
departure is told to the policy, which may release workers it was holding.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import NamedTuple

from .base import Decision, Record, SyncPolicy


class Apply(NamedTuple):
    """Apply `worker`'s push as one optimizer step at the learning rate of `version` (the version
    before the step)."""

    worker: int
    version: int


class Reject(NamedTuple):
    """`worker`'s `iteration`-th push held NaN or Inf: never applied."""

    worker: int
    iteration: int


class Reply(NamedTuple):
    """Answer `worker`'s pull with the weights of `version`; `stop`: its last reply."""

    worker: int
    version: int
    stop: bool


class Round(NamedTuple):
    """BSP: the mean of `members`' pushes (in worker order) as one step at the learning rate of
    `version`, then `replies` (with the weights after the step). No step when `members` is empty
    (every push of the round was rejected)."""

    members: tuple[int, ...]
    version: int
    replies: tuple[Reply, ...]


Action = Apply | Reject | Reply | Round | Record


class Executor:
    """What carries the coordinator's actions out, one method per action, called in the order of the
    actions (:meth:`Coordinator.push_to`). A reject and a record do nothing unless overridden.

    Attributes
    ----------
    apply : callable ``(worker, version)`` or None
        :class:`Apply`; None (the default): an apply has nothing to do here, and is not called (the
        simulator without weights, which makes millions of pushes).
    """

    apply: Callable[[int, int], None] | None = None

    def reject(self, worker: int, iteration: int) -> None:
        """:class:`Reject`."""

    def reply(self, worker: int, version: int, stop: bool) -> None:
        """:class:`Reply`."""
        raise NotImplementedError

    def round(self, members: tuple[int, ...], version: int, released: list[tuple[int, bool]]) -> None:
        """:class:`Round`: its replies are ``(worker, stop)`` in `released`, with the version after the
        step (`version` + 1, or `version` when `members` is empty)."""
        raise NotImplementedError

    def record(self, record: Record) -> None:
        """:class:`~ebsp_mpi.sync.base.Record`."""


class Actions(Executor):
    """An executor that keeps the actions as typed records, in order (:attr:`actions`)."""

    def __init__(self):
        self.actions: list[Action] = []

    def apply(self, worker: int, version: int) -> None:
        self.actions.append(Apply(worker, version))

    def reject(self, worker: int, iteration: int) -> None:
        self.actions.append(Reject(worker, iteration))

    def reply(self, worker: int, version: int, stop: bool) -> None:
        self.actions.append(Reply(worker, version, stop))

    def round(self, members: tuple[int, ...], version: int, released: list[tuple[int, bool]]) -> None:
        after = version + 1 if members else version
        self.actions.append(Round(members, version, tuple(Reply(w, after, stop) for w, stop in released)))

    def record(self, record: Record) -> None:
        self.actions.append(record)


class Coordinator:
    """Rank 0's decisions over `policy` (a fresh :class:`~ebsp_mpi.sync.base.SyncPolicy`).

    Parameters
    ----------
    policy : SyncPolicy
    limits : sequence of int or None
        Per worker, the pushes after which it stops (``stop.iterations`` / ``stop.epochs``); None:
        no limit.
    stop_seconds : float
        A worker released at or after this run time gets its stop reply (``stop.seconds``; 0 or
        inf: none).
    """

    def __init__(self, policy: SyncPolicy, limits: Sequence[int | None], stop_seconds: float = 0.0):
        if len(limits) != policy.workers:
            raise ValueError(f"{len(limits)} iteration limits for {policy.workers} workers")
        self.policy = policy
        self.workers = policy.workers
        self.limits = [math.inf if lim is None else int(lim) for lim in limits]
        self.stop_seconds = stop_seconds or math.inf
        self.version = 0
        # every worker's pushes taken in, accepted or rejected: the policy's own counts, read here
        self.pushes = policy.push_counts
        self.rejected = 0
        self.left: set[int] = set()
        self.round_members: list[int] = []  # BSP: the accepted pushes of the open round
        self.stopping = False
        self._open_until = self.stop_seconds  # a worker released before this time goes on; -inf: stopping

    @property
    def finished(self) -> bool:
        """Every worker has had its stop reply."""
        return len(self.left) == self.workers

    def request_stop(self) -> None:
        """Stop every worker at its next pull (SIGTERM: the run checkpoints and ends cleanly)."""
        self.stopping = True
        self._open_until = -math.inf

    def restore(self, version: int, pushes: Sequence[int], rejected: int, policy_state: dict) -> None:
        """Go on from a checkpoint: the counts, and the policy's state (``SyncPolicy.load_state_dict``),
        which holds the pushes too: `pushes` must agree with it."""
        if len(pushes) != self.workers:
            raise ValueError(f"a checkpoint of {len(pushes)} workers; this run has {self.workers}")
        self.version, self.rejected = int(version), int(rejected)
        self.policy.load_state_dict(policy_state)
        if [int(p) for p in pushes] != self.pushes:
            raise ValueError(f"a checkpoint whose pushes {list(pushes)} disagree with its policy's {self.pushes}")

    def owes_push(self, worker: int) -> bool:
        """`worker` computes its next push: it has not left, and its pull is not held."""
        return worker not in self.left and worker not in self.policy.held

    def next_is_last(self, worker: int) -> bool:
        """`worker`'s next push is its last (its iteration limit)."""
        return self.pushes[worker] + 1 >= self.limits[worker]

    # -- events ---------------------------------------------------------------------------------

    def start(self, t: float) -> list[Action]:
        """Every worker pulls the initial weights: the actions."""
        actions = Actions()
        self.start_to(actions, t)
        return actions.actions

    def push(self, worker: int, t: float, rejected: bool = False) -> list[Action]:
        """`worker`'s next push arrived whole at `t` (`rejected`: it held NaN or Inf); it now waits
        for its next weights. The actions."""
        actions = Actions()
        self.push_to(actions, worker, t, rejected)
        return actions.actions

    def start_to(self, executor: Executor, t: float) -> None:
        """:meth:`start`, its actions carried out by `executor`."""
        self._carry(self.policy.start(t), t, executor)

    def push_to(self, executor: Executor, worker: int, t: float, rejected: bool = False) -> None:
        """:meth:`push`, its actions carried out by `executor`."""
        if worker in self.left:
            raise ValueError(f"worker {worker} pushed after its stop reply")
        pushes, policy, limits = self.pushes, self.policy, self.limits
        if rejected:
            self.rejected += 1
            executor.reject(worker, pushes[worker])
        elif policy.round_based:
            self.round_members.append(worker)
        else:
            if executor.apply is not None:
                executor.apply(worker, self.version)
            self.version += 1
        decision = policy.on_push(worker, t)  # counts the push, in the counts read here as `pushes`
        done, release = pushes[worker], decision.release
        if len(release) < 2 and t < self._open_until and not decision.apply_round and not policy.records \
                and done < limits[worker]:
            # the common case, written out since it is most of a simulation's cost per push: at most one
            # worker released, nobody stops, no round, no trace row (what _carry would do with it)
            if not release:
                return
            w = release[0]
            if w == worker or (pushes[w] < limits[w] and w not in self.left):
                executor.reply(w, self.version, False)
                return
        self._carry(decision, t, executor)
        if done >= limits[worker] and worker not in self.left:
            # its last push: it stops now rather than when the policy would release it
            executor.reply(worker, self.version, True)
            self._leave(worker, t, executor)

    # -- carrying a decision out ----------------------------------------------------------------

    def _carry(self, decision: Decision, t: float, executor: Executor) -> None:
        """The actions of a policy decision. A worker stopped here leaves, and its departure is told to
        the policy, whose decision (it may release, and so stop, others) is carried out in turn: a
        work list, not recursion, since at a time limit thousands of workers may leave in a chain."""
        pending, left, pushes, limits = [decision], self.left, self.pushes, self.limits
        while pending:
            decision = pending.pop()
            if self.policy.records:
                self._take_records(executor)
            # a worker stops at its iteration limit, at the time limit, or at a stop request
            closing = t >= self._open_until
            released = [(w, closing or pushes[w] >= limits[w]) for w in decision.release if w not in left]
            if decision.apply_round:
                self._close_round(released, executor)
            else:
                for w, stop in released:
                    executor.reply(w, self.version, stop)
            for w, stop in released:
                if stop:
                    left.add(w)
                    pending.append(self.policy.on_leave(w, t))
        if self.policy.records:
            self._take_records(executor)

    def _leave(self, worker: int, t: float, executor: Executor) -> None:
        self.left.add(worker)
        self._carry(self.policy.on_leave(worker, t), t, executor)

    def _close_round(self, released: list[tuple[int, bool]], executor: Executor) -> None:
        members, version = tuple(sorted(self.round_members)), self.version
        self.round_members.clear()
        if members:
            self.version += 1
        executor.round(members, version, released)

    def _take_records(self, executor: Executor) -> None:
        for record in self.policy.take_records():
            executor.record(record)
