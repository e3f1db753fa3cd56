"""A replay of a run that was stopped and resumed: the simulation restarts where the run did.

A resumed run is not the run it would have been unbroken: at each restart the server restores the
checkpoint's counts into a fresh policy (which forgets what it learnt of the workers' pace: ElasticBSP
monitors again) and answers every worker at once, and the work done after the checkpoint is lost. A
replay that runs through diverges from it there (ElasticBSP's barriers land elsewhere, and its waits
differ by 15 - 20 % on a run resumed once). This one does what the server did:

- between restarts it runs the coordinator as :func:`ebsp_mpi.sim.events.simulate` does, except
  that a worker released for the iteration the next restart gives it (the checkpoint's count) does not
  start it: the recorded run's worker started that work and lost it;
- at a restart, at its recorded time (or once the segment's last push is in, if later), a fresh policy
  takes the counts and the old policy's state (``SyncPolicy.state_dict``), a new coordinator starts it,
  and every worker is answered anew.

The last iteration before a restart ends as recorded where its worker's row survived (a killed run's
worker may have had its reply after the checkpoint, in time the resumed run's clock does not count),
else at the reply the simulation gave it (its parked release, or the restart where the policy held it);
:class:`Cuts` records these for the trace: a recorded wait is the iteration's whole wait, a reply is
followed by its transit.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable, Sequence
from typing import NamedTuple

from ..sync.base import SyncPolicy
from ..sync.coordinator import Coordinator
from .events import SimResult, Simulation, interval_function
from .workers import Restart


class Cuts(NamedTuple):
    """Per worker, the iterations a restart cut short (iteration index -> seconds): ``replies[w]`` those
    ended by a reply of the simulation (its time; the iteration ends when its transit does), ``waits[w]``
    those that end as the recorded worker's did (its wait from its push, transit included)."""

    replies: list[dict[int, float]]
    waits: list[dict[int, float]]

    @classmethod
    def none(cls, workers: int) -> Cuts:
        return cls([{} for _ in range(workers)], [{} for _ in range(workers)])


class RestartedRun(Simulation):
    """One replay with restarts (see the module docstring)."""

    def __init__(self, coordinator: Coordinator, interval, t0: float, limits: Sequence[int | None], until: float):
        super().__init__(coordinator, interval, keep_releases=False, t0=t0)
        self.plain = False  # its own reply
        self.limits, self.until = list(limits), until
        # the count at which a worker's next release is parked until the restart (inf: none)
        self.parked_at: list[float] = [math.inf] * coordinator.workers
        self.cuts = Cuts.none(coordinator.workers)  # the iterations a restart cut short, and their ends

    def reply(self, w: int, version: int, stop: bool) -> None:
        if stop or self.coordinator.pushes[w] < self.parked_at[w]:
            super().reply(w, version, stop)
            return
        # released for the iteration the restart starts again: the recorded worker lost that work
        self.wait[w] += self.now - self.pulled_at[w]
        self.pulled_at[w] = None
        self.cuts.replies[w][self.coordinator.pushes[w] - 1] = self.now

    def segment(self, counts: Sequence[int]) -> float:
        """Run until every worker has pushed ``counts[w]`` (or stopped); the time of the last push."""
        self.parked_at = list(counts)
        last = -math.inf
        while self.heap:
            last = self.heap[0][0]
            t, w = heapq.heappop(self.heap)
            self.push(w, t)
        self.parked_at = [math.inf] * len(counts)
        return last

    def restart(self, t: float, policy: SyncPolicy, waits: Sequence[float | None] = ()) -> None:
        """Restart at `t` as the server does on ``--resume``: a fresh `policy` with the counts and the
        old policy's state, and every worker answered anew (those done get their stop reply again, which
        leaves their recorded end as it was). `waits`: per worker, the recorded wait of its iteration
        before the restart (None: not recorded)."""
        old = self.coordinator
        coordinator = Coordinator(policy, self.limits, self.until)
        coordinator.restore(old.version, old.pushes, old.rejected, self.policy.state_dict())
        self.coordinator, self.policy = coordinator, policy
        ended = [(e, v) for e, v in zip(self.end, self.stop_version, strict=True)]
        for w in range(coordinator.workers):
            last = old.pushes[w] - 1
            if self.pulled_at[w] is not None:  # held when the run stopped: its iteration ends at the restart
                self.cuts.replies[w][last] = t
            wait = waits[w] if w < len(waits) else None
            if wait is not None and last >= 0 and math.isnan(self.end[w]):
                # as the recorded worker had it, the transit of its reply in its wait
                self.cuts.replies[w].pop(last, None)
                self.cuts.waits[w][last] = wait
            self.pulled_at[w] = t
        self.start(t)
        for w, (e, v) in enumerate(ended):
            if not math.isnan(e):
                self.end[w], self.stop_version[w] = e, v


def simulate_resumed(make_policy: Callable[[], SyncPolicy], intervals, limit: int | None, until: float,
                     restarts: Sequence[Restart]) -> tuple[SimResult, Cuts]:
    """Replay with the recorded `restarts` (see the module docstring); the result, and the iterations
    a restart cut short (:class:`Cuts`)."""
    policy = make_policy()
    n = policy.workers
    limits = [limit] * n
    run = RestartedRun(Coordinator(policy, limits, until), interval_function(intervals, n), 0.0, limits, until)
    run.start(0.0)
    for restart in restarts:
        last = run.segment(restart.counts)
        run.restart(max(restart.t, last), make_policy(), restart.waits)
    run.segment([math.inf] * n)
    return run.result(), run.cuts
