"""The interface every synchronization model implements.

A policy is pure logic over events: it never sees MPI, arrays or a clock of its own. The parameter
server (``ebsp_mpi.runtime.servers.server``) drives it; the unit tests drive it with scripted event sequences;
a simulator can drive it with thousands of virtual workers.

Protocol, in the server's order of calls:

1. ``start(t)``: every worker pulls the initial weights; returns the workers released (all of them).
2. ``on_push(worker, t)``: ``worker`` pushed its next gradient at time ``t`` (seconds since the run's
   start) and now asks to pull the weights for its next iteration. The server has already applied the
   gradient (or, for a ``round_based`` policy, kept it for the round, whose mean it applies when the
   round closes). The returned
   :class:`Decision` names the workers whose pulls are answered now; everyone else who has pushed and
   was not released is *held*.
3. ``on_leave(worker, t)``: ``worker`` stopped (it reached its stop condition). It no longer pushes, so
   nobody may wait for it; the decision may release workers it was holding back.

Terms follow the papers: ``done[i]`` is the number of gradients worker i has pushed, a *barrier* is a
point where held workers are released together, *staleness* bounds how far ahead a worker may run.

Cost: every call is O(log n) or amortised O(1) in the number of workers n (a release of k workers costs
O(k) more), so that the simulator (:mod:`ebsp_mpi.sim.events`) can drive thousands of virtual workers. The push
counts live in a Python list (a NumPy element costs several times more to read and write), and the
minimum over the active workers is kept by a count of workers per push count instead of a reduction.
"""

from __future__ import annotations

import bisect
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import NamedTuple

import numpy as np


class Decision(NamedTuple):
    """What the server does after an event (a named tuple: cheap to make once per push).

    Attributes
    ----------
    release : tuple of int
        Workers whose pending pulls are answered now, with the current weights.
    apply_round : bool
        Only for ``round_based`` policies (BSP): the round is complete, so the server applies the mean
        of the round's gradients as one optimizer step *before* answering the released pulls.
    """

    release: tuple[int, ...] = ()
    apply_round: bool = False


NOTHING = Decision()


@dataclass
class Record:
    """A row a policy wants in the server's trace (table name and column values)."""

    table: str
    row: dict = field(default_factory=dict)


class SyncPolicy(ABC):
    """Base class: bookkeeping shared by every model (push counts, held set, active set).

    Parameters
    ----------
    workers : int
        Number of workers, indexed 0..workers-1 (worker i is MPI rank i + runtime.servers).
    """

    #: Name used in job files (``sync.model``) and in summary.json.
    name: str = ""
    #: True for BSP: the server keeps each worker's push of the round and, when the round completes,
    #: applies their mean (summed in worker order) as one optimizer step.
    round_based: bool = False

    def __init__(self, workers: int):
        if workers < 1:
            raise ValueError(f"a sync policy needs at least one worker, got {workers}")
        self.workers = workers
        self._done = [0] * workers
        self.active: set[int] = set(range(workers))
        self.held: set[int] = set()
        #: barriers released so far: points where held workers were let go together (a BSP round is one;
        #: ASP, SSP and DSSP have none)
        self.barriers = 0
        #: trace rows made since the last :meth:`take_records` (the coordinator takes them when any are here)
        self.records: list[Record] = []
        # _count[d]: active workers that have pushed d times; _min: the least d with _count[d] > 0
        self._count = [workers]
        self._min = 0
        # the decisions that release one worker, made once (ASP makes one per push)
        self._alone = [Decision(release=(w,)) for w in range(workers)]
        self._active_list = list(range(workers))  # sorted; a departure deletes by bisection
        self._active_sorted: tuple[int, ...] | None = tuple(range(workers))
        self._active_index: np.ndarray | None = None

    @property
    def active_index(self) -> np.ndarray:
        """The active workers as a sorted int64 index array (built again after a departure, when asked:
        rebuilding it at every departure made n departures cost O(n^2))."""
        if self._active_index is None:
            self._active_index = np.array(self._active_list, dtype=np.int64)
        return self._active_index

    @property
    def done(self) -> np.ndarray:
        """Pushes of every worker (int64, a copy: :meth:`pushes` reads one without copying)."""
        return np.array(self._done, dtype=np.int64)

    def pushes(self, worker: int) -> int:
        """Pushes of `worker` so far."""
        return self._done[worker]

    @property
    def push_counts(self) -> list[int]:
        """Every worker's pushes so far, accepted or rejected: the list itself, not a copy, which
        stays the same object for the policy's life (:meth:`load_state_dict` fills it in place), so
        that the coordinator reads the counts here instead of keeping its own. Read it; only
        :meth:`on_push` writes it."""
        return self._done

    def active_sorted(self) -> tuple[int, ...]:
        """The active workers in increasing order (kept until the next departure)."""
        if self._active_sorted is None:
            self._active_sorted = tuple(self._active_list)
        return self._active_sorted

    # -- the protocol -------------------------------------------------------------------------

    def start(self, t: float) -> Decision:
        """Release every worker to pull the initial weights."""
        return Decision(release=self.active_sorted())

    def on_push(self, worker: int, t: float) -> Decision:
        """Count the push, then let the model decide (see :meth:`_decide_push`)."""
        if worker not in self.active:
            self._check_worker(worker)
        if worker in self.held:
            raise ValueError(f"worker {worker} pushed while its pull was still held")
        d = self._done[worker]
        self._done[worker] = d + 1
        count = self._count
        count[d] -= 1
        if d + 1 == len(count):
            count.append(1)
        else:
            count[d + 1] += 1
        if d == self._min and not count[d]:
            self._min = d + 1
        self.held.add(worker)
        decision = self._decide_push(worker, t)
        if decision.release:
            self.held.difference_update(decision.release)
        return decision

    def on_leave(self, worker: int, t: float) -> Decision:
        """Remove a worker that stopped; nobody waits for it any more."""
        self._check_worker(worker)
        self.active.discard(worker)
        self._active_sorted = self._active_index = None
        del self._active_list[bisect.bisect_left(self._active_list, worker)]
        self.held.discard(worker)
        self._count[self._done[worker]] -= 1
        self._min = self._least_count()
        decision = self._decide_leave(worker, t)
        release = tuple(w for w in decision.release if w in self.active)
        self.held.difference_update(release)
        return Decision(release=release, apply_round=decision.apply_round)

    # -- what each model defines ---------------------------------------------------------------

    @abstractmethod
    def _decide_push(self, worker: int, t: float) -> Decision:
        """``worker`` (now in ``self.held``, ``done`` already counted) asks to pull at ``t``."""

    def _decide_leave(self, worker: int, t: float) -> Decision:
        """Default: a leaver frees nobody (models with waiting override this)."""
        return NOTHING

    # -- helpers -----------------------------------------------------------------------------

    def min_done(self) -> int:
        """Pushes of the slowest active worker (0 when none is active); O(1)."""
        return self._min if self.active else 0

    def _least_count(self) -> int:
        """The least push count of an active worker, searched upwards from the current minimum: a
        departure can only raise it, so the search costs O(1) amortised over a run."""
        d, count = self._min, self._count
        while d < len(count) and not count[d]:
            d += 1
        return d if d < len(count) else 0

    def state_dict(self) -> dict:
        """What a checkpoint keeps of the policy: its name, every worker's pushes and the barriers
        released so far (plain data, for JSON)."""
        return {"name": self.name, "done": list(self._done), "barriers": int(self.barriers)}

    def load_state_dict(self, state: dict) -> None:
        """Continue from :meth:`state_dict`'s `state`. Everything else starts as in a new run: every
        worker pulls at :meth:`start`, nobody is held, and what a model learns of the workers' pace
        (DSSP's intervals, ElasticBSP's push-time predictor) is learnt again, since the restart's
        pause would distort it; ElasticBSP resumes by monitoring, as after a barrier."""
        if state.get("name") != self.name or len(state.get("done", ())) != self.workers:
            raise ValueError(f"a checkpoint of {state.get('name')!r} with {len(state.get('done', ()))} workers "
                             f"cannot resume {self.name!r} with {self.workers}")
        self._done[:] = [int(d) for d in state["done"]]  # in place: push_counts stays the same list
        self._count = [0] * (max(self._done) + 1)
        for w in self.active:
            self._count[self._done[w]] += 1
        self._min = 0
        self._min = self._least_count()
        self.barriers = int(state["barriers"])

    def take_records(self) -> list[Record]:
        """Trace rows produced since the last call (barriers, ZipLine calls, ...); clears them."""
        records, self.records = self.records, []
        return records

    def _record(self, table: str, **row) -> None:
        self.records.append(Record(table, row))

    def _check_worker(self, worker: int) -> None:
        if not 0 <= worker < self.workers:
            raise ValueError(f"worker index {worker} out of range 0..{self.workers - 1}")
        if worker not in self.active:
            raise ValueError(f"worker {worker} already left")
