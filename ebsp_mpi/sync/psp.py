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

The sample of worker i at its c-th push is drawn by Floyd's algorithm (a uniform subset of β of the
other active workers) from β uniforms keyed by ``(seed, i, c)``, so a live run and a simulation of it
draw the same samples, whatever the order of events: outputs c·β .. c·β + β − 1 of a Philox generator
keyed by ``(seed, i)``. Philox is counter-based, so any push's uniforms are at hand without those
before them; a worker's are drawn 64 pushes at a time from one generator that goes on from block to
block, and the 64 samples of a block are drawn together, with NumPy, among the workers active then
(a push after a departure draws its own). A generator or a Floyd draw per push would cost more than
the rest of the push, and a simulation makes millions of them.
"""

from __future__ import annotations

import bisect
from array import array

import numpy as np

from .base import NOTHING, Decision, SyncPolicy
from .ssp import check_count


#: Pushes of one worker whose samples are drawn together (see the module docstring); a multiple of 4,
#: Philox's outputs per counter step.
_BLOCK = 64


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
        # worker j -> held workers watching j, a laggard of their sample (see _freed_by)
        self._watchers: dict[int, list[int]] = {}
        # worker -> (block, active workers, uniforms, samples) of its current block of pushes: see _block
        self._blocks: dict[int, tuple] = {}
        # worker -> (its Philox generator, the block whose uniforms it draws next)
        self._streams: dict[int, tuple[np.random.Generator, int]] = {}

    def draw(self, worker: int, pushes: int) -> tuple[int, ...]:
        """The sample of `worker` at its `pushes`-th push: β of the other active workers, seeded by
        ``(seed, worker, pushes)``, sorted."""
        block, row = divmod(pushes, _BLOCK)
        cached = self._blocks.get(worker)
        if cached is None or cached[0] != block:
            cached = self._blocks[worker] = self._block(worker, block)
        if cached[1] == len(self._active_list):  # nobody left since the block's samples were drawn
            row *= self.sample
            return tuple(cached[3][row:row + self.sample])
        return self._floyd(worker, cached[2][row].tolist())

    def _block(self, worker: int, block: int) -> tuple:
        """``(block, active, uniforms, samples)`` of one block of `worker`'s pushes: the samples of all
        its pushes, one row of β after another, drawn among the active workers of now, and `active`
        their number (the active workers only ever decrease, so it tells whether they are the same).

        The samples are :meth:`_floyd`'s, for all the rows at once. With β > 16 (quadratic here) or
        β or fewer others (no draw) they are left to it (`active` -1 matches nothing)."""
        uniforms = self._uniforms(worker, block)
        active = self.active_index
        present = worker in self.active
        beta, others = self.sample, len(active) - present
        if beta > 16 or others <= beta:
            return block, -1, uniforms, None
        # Floyd: the c-th uniform picks r in 0..j for j = m - β + c, or j itself where r is taken already
        chosen = (uniforms * np.arange(others - beta + 1, others + 1)).astype(np.int64)
        for c in range(1, beta):
            r = chosen[:, c]
            r[(chosen[:, :c] == r[:, None]).any(axis=1)] = others - beta + c
        chosen.sort(axis=1)
        if present:  # position p among the others is active worker p before `worker`, p + 1 from it on
            chosen += chosen >= bisect.bisect_left(self._active_list, worker)
        # one array: a list of tuples would take several times the memory and be slower to read
        return block, len(active), uniforms, array("q", active[chosen].astype(np.int64, copy=False).tobytes())

    def _uniforms(self, worker: int, block: int) -> np.ndarray:
        """The (pushes, β) uniforms in [0, 1) of one block of `worker`'s pushes (see the module docstring)."""
        stream = self._streams.get(worker)
        if stream is None or stream[1] != block:  # not where its last block left the generator: go there
            key = np.random.SeedSequence([self.seed, worker]).generate_state(2, np.uint64)
            # each counter step makes 4 outputs, one uniform each: the block starts at step block·_BLOCK·β/4
            generator = np.random.Generator(np.random.Philox(counter=block * _BLOCK * self.sample // 4, key=key))
        else:
            generator = stream[0]
        self._streams[worker] = (generator, block + 1)
        return generator.random((_BLOCK, self.sample))

    def _floyd(self, worker: int, uniforms: list[float]) -> tuple[int, ...]:
        """The sample drawn with β `uniforms`: Floyd's uniform subset of β of the active workers other
        than `worker` (all of them when they are β or fewer), sorted."""
        active = self._active_list
        present = worker in self.active
        others = len(active) - present
        if others <= self.sample:
            return tuple(w for w in active if w != worker)
        chosen: list[int] = []
        seen = chosen if self.sample <= 16 else set()  # membership tests: a short list is quicker
        # for j = m - β .. m - 1 take a uniform r in 0..j, or j itself if r is taken already
        j = others - self.sample
        for u in uniforms:
            r = int(u * (j + 1))
            if r in seen:
                r = j
            chosen.append(r)
            if seen is not chosen:
                seen.add(r)
            j += 1
        chosen.sort()
        sample = []
        for p in chosen:  # position p among the others: `active` without `worker`
            w = active[p]
            if present and w >= worker:
                w = active[p + 1]
            sample.append(w)
        return tuple(sample)

    def _decide_push(self, worker: int, t: float) -> Decision:
        pushes = self._done[worker]
        need = pushes - self.staleness
        release = self._freed_by(worker) if worker in self._watchers else []
        if need <= self._min:  # nobody lags: whatever the sample, it is within the bound (no draw needed)
            lagging, sample = -1, ()
        else:
            sample = self.draw(worker, pushes)
            done, active = self._done, self.active
            for lagging in sample:  # self._lagging(sample, need), written out (a call per push saved)
                if done[lagging] < need and lagging in active:
                    break
            else:
                lagging = -1
        if lagging < 0:
            if not release:
                return self._alone[worker]
            release.append(worker)
        else:
            self.waiting[worker] = (sample, need)
            self._watchers.setdefault(lagging, []).append(worker)
        return Decision(release=tuple(sorted(release))) if release else NOTHING

    def _decide_leave(self, worker: int, t: float) -> Decision:
        # a worker that left holds nobody back: it counts as caught up in every sample
        self.waiting.pop(worker, None)
        return Decision(release=tuple(sorted(self._freed_by(worker))))

    def _lagging(self, sample: tuple[int, ...], need: int) -> int:
        """The first active worker of `sample` with fewer than `need` pushes; -1 when none."""
        done, active = self._done, self.active
        for j in sample:
            if done[j] < need and j in active:
                return j
        return -1

    def _freed_by(self, worker: int) -> list[int]:
        """Held workers that `worker`'s push (or departure) lets go: those whose sample now all caught up.

        A held worker watches one lagging worker of its sample at a time (the first); when that one
        pushes or leaves, the held worker goes if nobody of its sample lags any more, else it watches
        the next laggard. It is thus let go at the push that brings its last laggard up, as if it
        checked its whole sample at every push of any of them, for O(1) per push that changes nothing.
        """
        freed = []
        done, active, watchers = self._done, self.active, self._watchers
        for i in watchers.pop(worker, ()):
            if i not in self.waiting:  # it left while held
                continue
            sample, need = self.waiting[i]
            if done[worker] < need and worker in active:  # still behind: keep watching it
                watchers.setdefault(worker, []).append(i)
                continue
            lagging = self._lagging(sample, need)
            if lagging < 0:
                del self.waiting[i]
                freed.append(i)
            else:
                watchers.setdefault(lagging, []).append(i)
        return freed

    def load_state_dict(self, state: dict) -> None:
        super().load_state_dict(state)
        self.waiting.clear()
        self._watchers.clear()
        self._blocks.clear()
        self._streams.clear()
