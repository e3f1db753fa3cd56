"""A worker's peak memory, as OSDP's cost model predicts it: what its model, buffers and steps held at
once, above what the process held before it built them (the data set, the interpreter, MPI).

On NumPy, the bytes of the arrays the worker holds for the whole run (its ``ParamSpace`` buffers, the
fetch buffer, the split layers' temporary), plus the most that ``tracemalloc`` (to which NumPy reports
every array it allocates) saw allocated at once during training beyond what was allocated when
training started: the activations and temporaries of the steps. Tracing starts only then, because
set-up imports modules (compiled kernels, HDF5) whose code objects would otherwise count.

On CuPy, the device memory pool: its blocks are freed before the model is built, and the pool keeps
every block it has ever needed (nothing is given back to the device while the run lasts), so its
total at the end, less its total at the start, is the device memory held at the busiest moment,
rounded up to the pool's blocks.
"""

from __future__ import annotations

import tracemalloc


class PeakMemory:
    """Made before the model is built; :meth:`training` when set-up is done; :meth:`stop` returns the
    peak in bytes."""

    def __init__(self, backend):
        self.pool = backend.xp.get_default_memory_pool() if backend.name == "cupy" else None
        if self.pool is not None:
            self.pool.free_all_blocks()
            self.base = self.pool.total_bytes()

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

    def stop(self) -> int:
        if self.pool is not None:
            return int(self.pool.total_bytes() - self.base)
        peak = self.held + tracemalloc.get_traced_memory()[1] - self.base
        if self.started:
            tracemalloc.stop()
        return int(peak)
