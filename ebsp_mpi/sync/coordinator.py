"""The coordinator: what rank 0 decides on each event, written once (docs/design.md, "The coordinator").

A :class:`Coordinator` wraps a sync policy and owns everything the parameter server decides: the
version count, every worker's push count, the rejected pushes, BSP's round, the iteration limits
and the workers that have left, and the stop (a time limit, or a stop request on SIGTERM). It is
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

The drivers carry the actions out and decide nothing: the MPI server (``runtime/server.py``, and
through its order stream the other servers) and the event simulator (:mod:`.simulate`). The
single-process reference trainer does not use it: it is the oracle the MPI runs are checked against.

Events: :meth:`~Coordinator.start` (every worker pulls the initial weights),
:meth:`~Coordinator.push` (worker w's push at time t, which is also its request to pull: a worker
asks for its next weights by pushing) and :meth:`~Coordinator.request_stop` (stop every worker at
its next pull). A worker leaves after its last push (its iteration limit) or at a stop reply; each
departure is told to the policy, which may release workers it was holding.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
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
        self.pushes = [0] * self.workers  # pushes taken in, accepted or rejected
        self.rejected = 0
        self.left: set[int] = set()
        self.round_members: list[int] = []  # BSP: the accepted pushes of the open round
        self.stopping = False

    @property
    def finished(self) -> bool:
        """Every worker has had its stop reply."""
        return len(self.left) == self.workers

    def request_stop(self) -> None:
        """Stop every worker at its next pull (SIGTERM: the run checkpoints and ends cleanly)."""
        self.stopping = True

    def restore(self, version: int, pushes: Sequence[int], rejected: int, policy_state: dict) -> None:
        """Go on from a checkpoint: the counts, and the policy's state (``SyncPolicy.load_state_dict``)."""
        if len(pushes) != self.workers:
            raise ValueError(f"a checkpoint of {len(pushes)} workers; this run has {self.workers}")
        self.version, self.rejected = int(version), int(rejected)
        self.pushes = [int(p) for p in pushes]
        self.policy.load_state_dict(policy_state)

    # -- events ---------------------------------------------------------------------------------

    def start(self, t: float) -> list[Action]:
        """Every worker pulls the initial weights."""
        actions: list[Action] = []
        self._carry(self.policy.start(t), t, actions)
        return actions

    def push(self, worker: int, t: float, rejected: bool = False) -> list[Action]:
        """`worker`'s next push arrived whole at `t` (`rejected`: it held NaN or Inf); it now waits
        for its next weights."""
        if worker in self.left:
            raise ValueError(f"worker {worker} pushed after its stop reply")
        actions: list[Action] = []
        if rejected:
            self.rejected += 1
            actions.append(Reject(worker, self.pushes[worker]))
        elif self.policy.round_based:
            self.round_members.append(worker)
        else:
            actions.append(Apply(worker, self.version))
            self.version += 1
        self.pushes[worker] += 1
        self._carry(self.policy.on_push(worker, t), t, actions)
        if self.pushes[worker] >= self.limits[worker] and worker not in self.left:
            # its last push: it stops now rather than when the policy would release it
            actions.append(Reply(worker, self.version, True))
            self._leave(worker, t, actions)
        return actions

    # -- carrying a decision out ----------------------------------------------------------------

    def _carry(self, decision: Decision, t: float, actions: list[Action]) -> None:
        """The actions of a policy decision. A worker stopped here leaves, and its departure is told to
        the policy, whose decision (it may release, and so stop, others) is carried out in turn: a
        work list, not recursion, since at a time limit thousands of workers may leave in a chain."""
        pending = [decision]
        while pending:
            decision = pending.pop()
            self._take_records(actions)
            released = [(w, self._must_stop(w, t)) for w in decision.release if w not in self.left]
            if decision.apply_round:
                actions.append(self._close_round(released))
            else:
                actions.extend(Reply(w, self.version, stop) for w, stop in released)
            for w, stop in released:
                if stop:
                    self.left.add(w)
                    pending.append(self.policy.on_leave(w, t))
        self._take_records(actions)

    def _leave(self, worker: int, t: float, actions: list[Action]) -> None:
        self.left.add(worker)
        self._carry(self.policy.on_leave(worker, t), t, actions)

    def _close_round(self, released: list[tuple[int, bool]]) -> Round:
        members, version = tuple(sorted(self.round_members)), self.version
        self.round_members.clear()
        if members:
            self.version += 1
        return Round(members, version, tuple(Reply(w, self.version, stop) for w, stop in released))

    def _must_stop(self, worker: int, t: float) -> bool:
        return self.pushes[worker] >= self.limits[worker] or self.stopping or t >= self.stop_seconds

    def _take_records(self, actions: list[Action]) -> None:
        if self.policy._records:
            actions.extend(self.policy.take_records())
