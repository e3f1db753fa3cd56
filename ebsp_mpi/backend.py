"""The array backend: NumPy on the CPU, CuPy on a GPU, chosen per process.

``backend = "auto" | "numpy" | "cupy"`` in the job; the environment variable ``EBSP_BACKEND``
overrides it (handy on a cluster where the same job file runs on CPU and GPU nodes). CuPy is imported
only when asked for or probed, so importing :mod:`ebsp_mpi` never needs it.

A worker picks its GPU from its node-local rank (``local_rank % device_count``) *before* its first
CuPy allocation, so every rank on a node gets its own device (or they share round-robin when there
are more ranks than devices). Under Slurm with ``--gpus-per-task=1`` each task sees one device and
the index is 0.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

import numpy as np

from .errors import UsageError

BACKENDS = ("auto", "numpy", "cupy")


class BackendError(UsageError, RuntimeError):
    """The requested backend cannot be used here (the message says why)."""


@dataclass(frozen=True)
class Backend:
    """An array module and the device it computes on.

    Attributes
    ----------
    name : str
        ``"numpy"`` or ``"cupy"``.
    xp : module
        The array module (``numpy`` or ``cupy``).
    device : int or None
        The CUDA device index for CuPy, None for NumPy.
    """

    name: str
    xp: Any
    device: int | None = None

    def asarray(self, a, dtype=None):
        """Host array -> an array of this backend (no copy for NumPy when the dtype matches)."""
        return self.xp.asarray(a, dtype=dtype)

    def to_host(self, a) -> np.ndarray:
        """An array of this backend -> a NumPy array (a device-to-host copy for CuPy)."""
        if self.name == "cupy":
            return self.xp.asnumpy(a)
        return np.asarray(a)

    def host_empty(self, n: int, dtype=np.float32) -> np.ndarray:
        """`n` uninitialised host values for staging this backend's arrays: on CuPy in page-locked
        memory (``cupyx.empty_pinned``), which the copy engine reads and writes directly, where a
        copy from pageable memory goes through a bounce buffer at a fraction of the speed."""
        if self.name == "cupy":
            try:
                import cupyx
            except ImportError:  # a stand-in CuPy without it
                return np.empty(n, dtype=dtype)
            return cupyx.empty_pinned((n,), dtype=dtype)
        return np.empty(n, dtype=dtype)

    def copy_to_host(self, dst: np.ndarray, a) -> None:
        """This backend's array `a` -> the existing C-contiguous host array `dst`, in place (on CuPy the
        copy waits for the stream, and makes no host temporary as ``to_host`` does)."""
        if self.name == "cupy":
            a.get(out=dst)
        else:
            dst[...] = a

    def copy_to_device(self, dst, host) -> None:
        """Host array -> the existing (C-contiguous) array `dst` of this backend, in place: on CuPy one
        host-to-device copy with no device temporary (``asarray`` would make one of `dst`'s size)."""
        if self.name == "cupy":
            dst.set(host)
        else:
            dst[...] = host

    def synchronize(self) -> None:
        """Wait for queued device work (before timing, or before MPI reads a device buffer)."""
        if self.name == "cupy":
            self.xp.cuda.get_current_stream().synchronize()

    def describe(self) -> str:
        """A short description for logs and trace attributes, e.g. ``cupy:0 (NVIDIA H100 80GB HBM3)``."""
        if self.name != "cupy":
            return "numpy (cpu)"
        props = self.xp.cuda.runtime.getDeviceProperties(self.device)
        name = props["name"].decode() if isinstance(props["name"], bytes) else props["name"]
        return f"cupy:{self.device} ({name})"


NUMPY = Backend("numpy", np)


def cupy_status() -> tuple[Any, str]:
    """``(cupy module, "")`` when CuPy imports and sees a CUDA device, else ``(None, reason)``."""
    try:
        import cupy
    except Exception as e:  # noqa: BLE001 - ImportError, or a CUDA library that fails to load
        return None, f"CuPy cannot be imported ({type(e).__name__}: {e}); install the extra: pip install -e '.[gpu]'"
    try:
        count = cupy.cuda.runtime.getDeviceCount()
    except Exception as e:  # noqa: BLE001 - CUDA's errors have no common base short of Exception
        return None, f"CuPy sees no CUDA driver or device ({type(e).__name__}: {e})"
    if count < 1:
        return None, "CuPy sees no CUDA device"
    return cupy, ""


def resolve_backend(requested: str = "auto", local_rank: int = 0, env=None) -> Backend:
    """Choose the backend of this process.

    Parameters
    ----------
    requested : str
        The job's ``backend``; ``EBSP_BACKEND`` in `env` overrides it.
    local_rank : int
        This process's rank among the processes on its node; picks the GPU.
    env : mapping, optional
        The environment to read (default ``os.environ``).

    Raises
    ------
    BackendError
        When ``cupy`` is asked for (or named in ``EBSP_BACKEND``) and cannot be used, or the name is unknown.
    """
    env = os.environ if env is None else env
    name = env.get("EBSP_BACKEND") or requested
    if name not in BACKENDS:
        source = "EBSP_BACKEND" if env.get("EBSP_BACKEND") else "backend"
        raise BackendError(f"{source} = {name!r}: must be one of {', '.join(BACKENDS)}")
    if name == "numpy":
        return NUMPY
    cupy, reason = cupy_status()
    if cupy is None:
        if name == "cupy":
            raise BackendError(f"backend = 'cupy' but {reason}")
        return NUMPY
    device = local_rank % cupy.cuda.runtime.getDeviceCount()
    cupy.cuda.Device(device).use()
    return Backend("cupy", cupy, device)
