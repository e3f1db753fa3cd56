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
rounded up to the pool's blocks. Left alone, the pool also keeps blocks that no array uses any more
(a temporary of one size does not serve a request of another), which no plan counts: on an H200
that held 24 - 62 % over the plan's prediction. So the worker bounds the pool
(``MemoryPool.set_limit``) at the prediction plus :data:`POOL_HEADROOM`, never above the plan's
memory limit: at the bound CuPy first frees the cached blocks no array holds and tries again, so only
the arrays themselves can reach it, and then the run stops in one line (the plan does not fit this
device). Beside the pool's total, a memory hook keeps the most the arrays held at once
(``live_peak_bytes``), to tell the plan's error from the pool's.
"""

from __future__ import annotations

import contextlib
import tracemalloc

import numpy as np

from ...errors import UsageError

#: on CuPy, the device memory a worker's pool may hold beyond its plan's predicted peak (a fraction)
POOL_HEADROOM = 0.15


def pool_bound(predicted_bytes: int | None, limit_bytes: int | None) -> int | None:
    """The bytes a worker's device memory pool may hold above what it held before the model was built:
    the plan's predicted peak plus :data:`POOL_HEADROOM`, never above the plan's memory limit; None
    (no bound) for a plan that states neither."""
    bounds = [int(b) for b in (predicted_bytes and predicted_bytes * (1 + POOL_HEADROOM), limit_bytes) if b]
    return min(bounds) if bounds else None


class PeakMemory:
    """Made before the model is built; :meth:`training` when set-up is done; :meth:`stop` returns the
    peak in bytes.

    Parameters
    ----------
    backend : Backend
        The worker's array backend.
    predicted_bytes, limit_bytes : int, optional
        The plan's predicted peak and its memory limit: on CuPy they bound the pool (:func:`pool_bound`).
    """

    def __init__(self, backend, predicted_bytes: int | None = None, limit_bytes: int | None = None):
        self.pool = backend.xp.get_default_memory_pool() if backend.name == "cupy" else None
        self.highest = 0  # the traced peak before the last excluded stretch
        self.tracing = False
        self.live = None  # CuPy: the hook that keeps the most that arrays held at once
        if self.pool is not None:
            self.pool.free_all_blocks()
            self.base = self.pool.total_bytes()
            self.bound = pool_bound(predicted_bytes, limit_bytes)
            if self.bound is not None:
                self.pool.set_limit(size=self.base + self.bound)
            self.live = _live_high_water(backend.xp, self.pool)
            self.live.__enter__()

    @property
    def live_peak(self) -> int | None:
        """CuPy: the most bytes the pool's arrays held at once, above what they held at the start."""
        return None if self.live is None else max(0, self.live.high - self.live.start)

    @contextlib.contextmanager
    def bounded(self):
        """A block in which the pool's ``OutOfMemoryError`` at its bound becomes one line
        (:class:`UsageError`: the plan does not fit this device), whatever allocated."""
        try:
            yield
        except Exception as e:
            if self.pool is None or self.bound is None or type(e).__name__ != "OutOfMemoryError":
                raise
            raise self._overrun() from e

    def _overrun(self) -> UsageError:
        mib = 2 ** 20
        return UsageError(f"OSDP: this worker's arrays need more device memory than its plan allows: the pool "
                          f"is bounded at {self.bound / mib:.2f} MiB (the predicted peak + "
                          f"{POOL_HEADROOM:.0%}, at most the memory limit), and its arrays held "
                          f"{(self.live_peak or 0) / mib:.2f} MiB at most before this allocation; "
                          f"profile and plan on this device (plan ... --set backend=cupy)")

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
            self.live.__exit__(None, None, None)
            return int(self.pool.total_bytes() - self.base)
        peak = self.held + max(self.highest, tracemalloc.get_traced_memory()[1]) - self.base
        self.tracing = False
        if self.started:
            tracemalloc.stop()
        return int(peak)


def _live_high_water(xp, pool):
    """A CuPy memory hook (entered in this thread) that keeps in ``high`` the most bytes the pool's
    arrays held at once, read after every allocation; ``start`` is what they held when it was made."""

    class LiveHighWater(xp.cuda.MemoryHook):
        name = "ebsp_live_high_water"

        def __init__(self):
            self.start = self.high = pool.used_bytes()

        def malloc_postprocess(self, **kwargs):
            used = pool.used_bytes()
            if used > self.high:
                self.high = used

    return LiveHighWater()


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
