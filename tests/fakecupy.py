"""A stand-in for CuPy on machines without a GPU, so that CPU CI runs the code only a GPU would run.

Tests only. Its arrays are NumPy memory in a subclass, :class:`ndarray`, that plays a device array:
it carries the device it was allocated on, exposes ``__cuda_array_interface__`` (as mpi4py's own
tests fake device buffers), and counts what a real device would make visible:

- **copies**: :func:`asarray` of a host array is a host-to-device copy, :func:`asnumpy` (and
  ``ndarray.get``) a device-to-host copy; each is counted with its bytes in :data:`state`;
- **asynchrony**: every kernel that writes into a device array (a ufunc with ``out=``, an in-place
  operator, an assignment, any other NumPy function) leaves work *pending* on the stream until
  ``cuda.get_current_stream().synchronize()`` or a device-to-host copy (which waits for the stream,
  as CuPy's does) completes it. Code that hands a device buffer to MPI while work is pending would
  send stale values on a GPU; tests read ``state.pending`` there;
- **separate memories**: a ufunc that mixes a device array with a host array raises ``TypeError``, as
  CuPy's do. What it cannot refuse: code that takes a buffer (``host[...] = device``, a Numba kernel,
  MPI) reads a fake device array as host memory, where a real one has no buffer to give; the copy
  counters are there to catch that.

The device count comes from ``FAKECUPY_DEVICES`` (default 1). Install it as ``cupy`` with
:func:`install` (in-process), or put ``tests/fakecupy_path`` on ``PYTHONPATH`` so that ``import cupy``
loads it in child processes (``mpiexec ... python -m ebsp_mpi train``; :func:`child_env`). With
``FAKECUPY_REPORT`` set to a directory, each process writes its counters there at exit (``<pid>.json``).
"""

from __future__ import annotations

import atexit
import json
import os
import sys
import types
import weakref
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

DEVICES_ENV = "FAKECUPY_DEVICES"
REPORT_ENV = "FAKECUPY_REPORT"
#: The folder whose ``cupy`` package is this module: on ``PYTHONPATH``, child processes import it as CuPy.
PATH = Path(__file__).resolve().parent / "fakecupy_path"


@dataclass
class State:
    """What the fake device has seen in this process (reset by :func:`reset`)."""

    device: int = 0  # the current device (cuda.Device(i).use())
    devices_used: set = field(default_factory=set)  # devices that arrays were allocated on
    h2d_copies: int = 0
    h2d_bytes: int = 0
    d2h_copies: int = 0
    d2h_bytes: int = 0
    synchronizes: int = 0
    pending: bool = False  # kernels queued on the stream and not yet waited for

    def as_dict(self) -> dict:
        d = asdict(self)
        d["devices_used"] = sorted(self.devices_used)
        return d


state = State()


def reset() -> State:
    """Forget every count (the current device goes back to 0)."""
    global state
    state = State()
    _POOL.limit = 0
    return state


def device_count() -> int:
    return int(os.environ.get(DEVICES_ENV, "1"))


def _launch() -> None:
    """A kernel was queued on the current stream."""
    state.pending = True


# -- the device array ---------------------------------------------------------------------------------


class ndarray(np.ndarray):  # CuPy's name
    """A device array: NumPy memory that knows its device and refuses to mix with host arrays."""

    def __array_finalize__(self, obj):
        self.device_id = getattr(obj, "device_id", state.device)
        _POOL.hold(self)  # a fresh array is a new block of the pool; a view holds its base's

    @property
    def device(self):
        return cuda.Device(self.device_id)

    @property
    def __cuda_array_interface__(self) -> dict:
        return {"shape": self.shape, "typestr": self.dtype.str, "version": 3,
                "data": (self.__array_interface__["data"][0], not self.flags.writeable),
                "strides": None if self.flags.c_contiguous else self.strides, "stream": 1}

    def get(self, stream=None, out=None):
        return asnumpy(self, stream=stream, out=out)

    def set(self, arr, stream=None):
        """Host -> this device array in place, as CuPy's: a NumPy array of this one's dtype and shape,
        into a contiguous target."""
        if not isinstance(arr, np.ndarray) or isinstance(arr, ndarray) or arr.dtype != self.dtype:
            raise TypeError(f"fakecupy: only a host array of {self.dtype} can be set to this array")
        if not self.flags.c_contiguous or arr.shape != self.shape:
            raise RuntimeError("fakecupy: set needs a C-contiguous target of the host array's shape")
        _count_h2d(np.asarray(arr))
        _launch()
        np.copyto(self.view(np.ndarray), arr)

    def __setitem__(self, key, value):
        if isinstance(value, np.ndarray) and not isinstance(value, ndarray) and value.ndim:
            _count_h2d(value)  # CuPy accepts a host array here and copies it to the device
        _launch()
        super().__setitem__(key, value)

    def __array_ufunc__(self, ufunc, method, *inputs, out=None, **kwargs):
        _refuse_mixing(ufunc.__name__, inputs + (out or ()))
        if method == "at" or any(isinstance(o, ndarray) for o in out or ()):
            _launch()  # it writes into an existing device array (a fresh result is no buffer MPI reads)
        args = [a.view(np.ndarray) if isinstance(a, ndarray) else a for a in inputs]
        if out is not None:
            kwargs["out"] = tuple(o.view(np.ndarray) if isinstance(o, ndarray) else o for o in out)
        result = super().__array_ufunc__(ufunc, method, *args, **kwargs)
        if result is NotImplemented:
            return NotImplemented
        if out is not None:
            return out[0] if len(out) == 1 else out
        if isinstance(result, tuple):
            return tuple(_on_device(r) for r in result)
        return _on_device(result)

    def __array_function__(self, func, types_, args, kwargs):
        _launch()
        return super().__array_function__(func, types_, args, kwargs)

    def __reduce__(self):  # never pickled by accident as a host array
        raise TypeError("a fake device array cannot be pickled; copy it to the host first")


def _on_device(r):
    if isinstance(r, np.ndarray) and not isinstance(r, ndarray):
        return r.view(ndarray)
    return r  # a scalar


def _refuse_mixing(what: str, arrays) -> None:
    device = any(isinstance(a, ndarray) for a in arrays)
    host = any(isinstance(a, np.ndarray) and not isinstance(a, ndarray) and a.ndim for a in arrays)
    if device and host:
        raise TypeError(f"fake cupy: {what} mixes a device array with a host numpy.ndarray "
                        f"(copy it with cupy.asarray or cupy.asnumpy first)")


def _count_h2d(host: np.ndarray) -> None:
    state.h2d_copies += 1
    state.h2d_bytes += host.nbytes


def _new(host: np.ndarray) -> ndarray:
    """A device array holding `host`'s memory, allocated on the current device."""
    state.devices_used.add(state.device)
    _launch()
    a = host.view(ndarray)
    a.device_id = state.device
    return a


# -- the array module ---------------------------------------------------------------------------------


def asarray(a, dtype=None, order=None):
    if isinstance(a, ndarray):
        return a if dtype is None or np.dtype(dtype) == a.dtype else a.astype(dtype)
    host = np.array(a, dtype=dtype, order=order or "K", copy=True)
    _count_h2d(host)
    return _new(host)


def array(a, dtype=None, copy=True, order="K"):
    if isinstance(a, ndarray) and not copy:
        return asarray(a, dtype)
    if isinstance(a, ndarray):
        return a.astype(dtype or a.dtype, order=order, copy=True)
    return asarray(a, dtype, order)


def asnumpy(a, stream=None, out=None):
    """Device -> host: waits for the stream (as CuPy's blocking copy does), then copies."""
    if not isinstance(a, ndarray):
        return np.asarray(a)
    state.pending = False
    state.d2h_copies += 1
    state.d2h_bytes += a.nbytes
    host = np.array(a.view(np.ndarray), copy=True)
    if out is not None:
        out[...] = host
        return out
    return host


def _creation(name):
    make = getattr(np, name)

    def create(*args, **kwargs):
        return _new(make(*args, **kwargs))

    create.__name__ = name
    return create


zeros, empty, ones, full, arange = (_creation(n) for n in ("zeros", "empty", "ones", "full", "arange"))


def zeros_like(a, dtype=None):
    return _new(np.zeros(a.shape, dtype=dtype or a.dtype))


def empty_like(a, dtype=None):
    return _new(np.empty(a.shape, dtype=dtype or a.dtype))


def _as_strided(x, shape=None, strides=None):
    return np.lib.stride_tricks.as_strided(x, shape, strides, subok=True)


lib = types.SimpleNamespace(stride_tricks=types.SimpleNamespace(as_strided=_as_strided))


def __getattr__(name):
    # ufuncs and functions that keep the subclass (exp, matmul, sum, float32, ...): NumPy's own
    return getattr(np, name)


# -- cupy.cuda ------------------------------------------------------------------------------------------


class _Stream:
    def synchronize(self) -> None:
        state.synchronizes += 1
        state.pending = False


class _Device:
    def __init__(self, device: int = 0):
        if not 0 <= device < device_count():
            raise RuntimeError(f"fake cupy: no device {device} ({DEVICES_ENV}={device_count()})")
        self.id = device

    def use(self) -> None:
        state.device = self.id

    def synchronize(self) -> None:
        _Stream().synchronize()

    def __enter__(self):
        self._previous = state.device
        self.use()
        return self

    def __exit__(self, *exc):
        state.device = self._previous

    def __eq__(self, other):
        return isinstance(other, _Device) and other.id == self.id

    def __hash__(self):
        return hash(self.id)


def _properties(device: int) -> dict:
    return {"name": f"Fake CUDA device {device}".encode(), "totalGlobalMem": 1 << 30}


class _MemoryPool:
    """CuPy's default memory pool, as far as the bytes it holds go.

    Every device array the fake hands out owns a block, rounded up to 512 bytes as CuPy's are; views
    share their base's. A block no array holds any more stays in the pool, cached for the next
    allocation: the pool gives nothing back to the device while a run lasts, so its total only grows,
    until :meth:`free_all_blocks` drops the cached blocks. The fake reuses cached blocks without
    fragmentation, so its total is the most its arrays ever held at once since then (CuPy's is at
    least that). With a limit (:meth:`set_limit`), a block that would take the total past it first
    drops the cached blocks, as CuPy's pool does, and raises :class:`OutOfMemoryError` when the arrays
    alone would pass it. Memory hooks (:class:`MemoryHook`, entered) hear of every new block.
    """

    ROUND = 512

    def __init__(self):
        self.used = 0  # bytes of the blocks arrays hold
        self.total = 0  # those and the cached ones
        self.limit = 0  # 0: none
        self._blocks: dict[int, weakref.finalize] = {}  # id of the array owning a block -> its release

    def hold(self, a: np.ndarray) -> None:
        """`a` was just made: if it owns memory not yet counted, that is a new block."""
        owner = a
        while getattr(owner, "base", None) is not None:  # a view of a view ... of the owner
            owner = owner.base
        if not isinstance(owner, np.ndarray) or id(owner) in self._blocks or owner.nbytes == 0:
            return  # memory the fake did not allocate (a buffer object's), already counted, or none
        size = -(-owner.nbytes // self.ROUND) * self.ROUND
        if self.limit and max(self.total, self.used + size) > self.limit:
            self.free_all_blocks()
            if self.used + size > self.limit:
                raise OutOfMemoryError(f"Out of memory allocating {size} bytes (limit {self.limit}: the pool's "
                                       f"arrays hold {self.used})")
        self.used += size
        self.total = max(self.total, self.used)
        release = weakref.finalize(owner, self._release, id(owner), size)
        release.atexit = False
        self._blocks[id(owner)] = release
        for hook in _HOOKS:
            hook.malloc_postprocess(device_id=state.device, size=owner.nbytes, mem_size=size)

    def _release(self, key: int, size: int) -> None:
        del self._blocks[key]
        self.used -= size  # the block stays in the pool, cached: the total keeps it

    def used_bytes(self) -> int:
        return self.used

    def total_bytes(self) -> int:
        return self.total

    def free_all_blocks(self) -> None:
        self.total = self.used

    def set_limit(self, size: int = 0) -> None:
        self.limit = int(size)

    def get_limit(self) -> int:
        return self.limit


class OutOfMemoryError(MemoryError):  # cupy.cuda.memory.OutOfMemoryError
    pass


_HOOKS: list = []


class MemoryHook:
    """cupy.cuda.MemoryHook: entered, its ``malloc_postprocess`` hears of every new block."""

    name = "MemoryHook"

    def __enter__(self):
        _HOOKS.append(self)
        return self

    def __exit__(self, *exc):
        _HOOKS.remove(self)

    def malloc_postprocess(self, **kwargs):
        pass


_POOL = _MemoryPool()


def get_default_memory_pool() -> _MemoryPool:
    return _POOL


cuda = types.SimpleNamespace(
    Device=_Device, Stream=_Stream, get_current_stream=lambda: _Stream(), MemoryHook=MemoryHook,
    memory=types.SimpleNamespace(OutOfMemoryError=OutOfMemoryError),
    runtime=types.SimpleNamespace(getDeviceCount=device_count, getDeviceProperties=_properties,
                                  deviceSynchronize=lambda: _Stream().synchronize()))

# ebsp_mpi.nn.losses tells a CuPy array by its class's module, as it would a real one
ndarray.__module__ = "cupy"


# -- installing it ------------------------------------------------------------------------------------


def install(monkeypatch) -> State:
    """Make ``import cupy`` give this module for one test (undone by `monkeypatch`); counts reset."""
    monkeypatch.setitem(sys.modules, "cupy", sys.modules[__name__])
    return reset()


def child_env(devices: int = 2, report: Path | None = None) -> dict:
    """The environment (to add to a child process's) under which ``import cupy`` loads this module,
    with `devices` devices; with `report`, each process writes its counters into that folder at exit."""
    env = {"PYTHONPATH": str(PATH), DEVICES_ENV: str(devices)}
    if report is not None:
        env[REPORT_ENV] = str(report)
    return env


def _report() -> None:
    where = os.environ.get(REPORT_ENV)
    if where:
        rank = os.environ.get("PMI_RANK", os.environ.get("OMPI_COMM_WORLD_RANK", "?"))
        Path(where, f"{os.getpid()}.json").write_text(json.dumps({"rank": rank, **state.as_dict()}))


atexit.register(_report)
