"""Probabilistic Synchronous Parallel: each barrier waits only for a random sample of the workers.

Wang, Catterall, Crowcroft, "Probabilistic Synchronous Parallel", arXiv:1709.07772 (2017). PSP turns a
barrier method into a sampled one: a worker that reaches its barrier draws β of the other workers and
checks the barrier's condition against them alone. Here the condition is SSP's (pSSP): worker i, having
pushed its c-th gradient, goes on once every worker j of its sample has ``done_j >= c - s``; s = 0 is
pBSP. Pushes are applied on arrival, as under SSP.

**Staleness bound.** At its release worker i is at most s iterations ahead of every worker of its
sample. Against all workers there is no fixed bound, only a probabilistic one (Wang et al.): a worker
outside every recent sample may fall further behind. With β >= n − 1 the sample is all the other active
workers and PSP is SSP(s), release for release.

The sample of worker i at its c-th push is drawn from a generator keyed by ``(seed, i, c)``, so a live
run and a simulation of it draw the same samples, whatever the order of events.
"""

from __future__ import annotations

import numpy as np

from .base import Decision, SyncPolicy
from .ssp import check_count


class PSP(SyncPolicy):
    """Probabilistic SSP: a pushing worker waits for a seeded sample of ``sample`` other workers to be
    within ``staleness`` iterations of it.

    Parameters
    ----------
    workers : int
        Number of workers.
    sample : int
        β >= 1, the workers each barrier samples (fewer when fewer others are active).
    staleness : int
        s >= 0 (iterations); 0 is pBSP.
    seed : int
        Seed of the samples.
    """

    name = "psp"

    def __init__(self, workers: int, sample: int = 2, staleness: int = 0, seed: int = 0):
        super().__init__(workers)
        self.sample = check_count("sample", sample)
        if self.sample < 1:
            raise ValueError(f"sample must be at least 1 (workers a barrier waits for), got {sample}")
        self.staleness = check_count("staleness", staleness)
        self.seed = check_count("seed", seed)
        #: held worker -> (its sample, the push count every sampled worker must reach)
        self.waiting: dict[int, tuple[tuple[int, ...], int]] = {}
        # worker j -> held workers whose sample holds j: a push of j can release only these
        self._dependents: dict[int, set[int]] = {}

    def draw(self, worker: int, pushes: int) -> tuple[int, ...]:
        """The sample of `worker` at its `pushes`-th push: β of the other active workers, seeded by
        ``(seed, worker, pushes)``, sorted."""
        others = [w for w in self.active_index.tolist() if w != worker]
        if len(others) <= self.sample:
            return tuple(others)
        rng = np.random.Generator(np.random.Philox(np.random.SeedSequence([self.seed, worker, pushes])))
        return tuple(sorted(rng.choice(others, size=self.sample, replace=False).tolist()))

    def _decide_push(self, worker: int, t: float) -> Decision:
        need = int(self.done[worker]) - self.staleness
        release = self._freed_by(worker)
        sample = self.draw(worker, int(self.done[worker]))
        if self._within(sample, need):
            release.append(worker)
        else:
            self.waiting[worker] = (sample, need)
            for j in sample:
                self._dependents.setdefault(j, set()).add(worker)
        return Decision(release=tuple(sorted(release)))

    def _decide_leave(self, worker: int, t: float) -> Decision:
        # a worker that left holds nobody back: it counts as caught up in every sample
        self.waiting.pop(worker, None)
        return Decision(release=tuple(sorted(self._freed_by(worker))))

    def _within(self, sample: tuple[int, ...], need: int) -> bool:
        return all(j not in self.active or int(self.done[j]) >= need for j in sample)

    def _freed_by(self, worker: int) -> list[int]:
        """Held workers that `worker`'s push (or departure) lets go: those whose sample now all caught up."""
        freed = []
        for i in sorted(self._dependents.pop(worker, ())):
            if i in self.waiting and self._within(*self.waiting[i]):
                sample, _ = self.waiting.pop(i)
                for j in sample:
                    self._dependents.get(j, set()).discard(i)
                freed.append(i)
            elif i in self.waiting:  # still waiting on others of its sample: keep listening to this one
                self._dependents.setdefault(worker, set()).add(i)
        return freed

    def load_state_dict(self, state: dict) -> None:
        super().load_state_dict(state)
        self.waiting.clear()
        self._dependents.clear()
