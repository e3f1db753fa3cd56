"""A worker's peak memory, as OSDP's cost model predicts it: what its model, buffers and steps held at
once, above what the process held before it built them (the data set, the interpreter, MPI).

On NumPy, the bytes of the arrays the worker holds for the whole run (its ``ParamSpace`` buffers, the
fetch buffer, the split layers' temporary), plus the most that ``tracemalloc`` (to which NumPy reports
every array it allocates) saw allocated at once during training beyond what was allocated when
training started: the activations and temporaries of the steps. Tracing starts only then, because
set-up imports modules (compiled kernels, HDF5) whose code objects would otherwise count.

What the worker's trace writer does while it flushes (h5py's and HDF5's own allocations, which now
and then rehash h5py's registry of objects: some 10 KB for an instant) is left out (:meth:`PeakMemory.
excluded`): it belongs to no plan, and a longer run meets more of it, so that the peak would grow with
the run's length.

On CuPy, the device memory pool: its blocks are freed before the model is built, and the pool keeps
every block it has ever needed (nothing is given back to the device while the run lasts), so its
total at the end, less its total at the start, is the device memory held at the busiest moment,
rounded up to the pool's blocks.
"""

from __future__ import annotations

import contextlib
import tracemalloc

import numpy as np


class PeakMemory:
    """Made before the model is built; :meth:`training` when set-up is done; :meth:`stop` returns the
    peak in bytes."""

    def __init__(self, backend):
        self.pool = backend.xp.get_default_memory_pool() if backend.name == "cupy" else None
        self.highest = 0  # the traced peak before the last excluded stretch
        self.tracing = False
        if self.pool is not None:
            self.pool.free_all_blocks()
            self.base = self.pool.total_bytes()

    @contextlib.contextmanager
    def excluded(self):
        """Leave out what the code in this block allocates for an instant (what it keeps still counts):
        the peak so far is kept aside, and tracemalloc's peak is reset after the block."""
        if not self.tracing:
            yield
            return
        self.highest = max(self.highest, tracemalloc.get_traced_memory()[1])
        try:
            yield
        finally:
            tracemalloc.reset_peak()

    def training(self, held) -> None:
        """Set-up is done: `held` are the arrays the worker keeps for the whole run."""
        if self.pool is not None:
            return
        self.held = sum(int(a.nbytes) for a in held)
        self.started = not tracemalloc.is_tracing()
        if self.started:
            tracemalloc.start()
        tracemalloc.reset_peak()
        self.base = tracemalloc.get_traced_memory()[0]
        self.tracing = True

    def stop(self) -> int:
        if self.pool is not None:
            return int(self.pool.total_bytes() - self.base)
        peak = self.held + max(self.highest, tracemalloc.get_traced_memory()[1]) - self.base
        self.tracing = False
        if self.started:
            tracemalloc.stop()
        return int(peak)


#: Iterations whose start times a worker keeps for its medians (the last ones).
KEEP = 1024


class IterationTimes:
    """Each iteration's start time and the seconds waited on fetches by then, for the last :data:`KEEP`
    iterations, in arrays made once: the medians a worker reports (``summary.json``'s ``osdp``) from
    memory that does not grow with the run (a list of every start grew ~100 bytes an iteration, which
    the peak counted)."""

    def __init__(self, keep: int = KEEP):
        self.starts = np.zeros(keep + 1)
        self.waited = np.zeros(keep + 1)
        self.count = 0

    def start(self, t: float, waited_s: float) -> None:
        """An iteration started at `t` (seconds), when the fetches had waited `waited_s` in all."""
        k = self.count % len(self.starts)
        self.starts[k], self.waited[k] = t, waited_s
        self.count += 1

    def medians(self) -> tuple[float | None, float]:
        """The median seconds from one start to the next and waited on fetches in between, over the
        last :data:`KEEP` iterations; while all are kept, the first (warm-up) is left out. (None, 0.0)
        before two starts past the first."""
        size = len(self.starts)
        if self.count <= size:
            starts, waited = self.starts[1:self.count], self.waited[1:self.count]
        else:  # oldest first
            k = self.count % size
            starts, waited = np.roll(self.starts, -k), np.roll(self.waited, -k)
        intervals, waits = np.diff(starts), np.diff(waited)
        return (float(np.median(intervals)) if intervals.size else None,
                float(np.median(waits)) if waits.size else 0.0)
