"""The memory a process may use, to refuse a dataset, a model or a simulation that cannot fit before
allocating it: the machine's physical memory, or the process's address-space limit (``ulimit -v``,
``RLIMIT_AS``) where that is lower.

An allocation larger than the memory does not fail at once on Linux: pages are handed out as they are
touched, so the process swaps or is killed by the OOM killer long after the cause (a label of 10**9,
``model.hidden = [100000000]``) could have been named. Comparing an estimate with the physical memory
catches the impossible cases in one line; it does not promise that a smaller size fits, since other
processes (other ranks on the node among them) share the memory.
"""

from __future__ import annotations

import os


def physical_memory() -> int | None:
    """Bytes of physical memory of this machine, or None where the system does not say."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (AttributeError, ValueError, OSError):  # no sysconf (Windows) or no such name
        return None


def address_space_limit() -> int | None:
    """Bytes this process may map (``ulimit -v``), or None where there is no limit or no way to ask."""
    try:
        import resource

        soft, _ = resource.getrlimit(resource.RLIMIT_AS)
    except (ImportError, AttributeError, ValueError, OSError):
        return None
    return None if soft == resource.RLIM_INFINITY or soft <= 0 else int(soft)


def _usable() -> tuple[int | None, str]:
    """The bytes this process may use, and the phrase that names them."""
    memory, limit = physical_memory(), address_space_limit()
    if limit is not None and (memory is None or limit < memory):
        return limit, f"this process's {format_bytes(limit)} address-space limit (ulimit -v)"
    if memory is None:
        return None, "this machine's physical memory"
    return memory, f"this machine's {format_bytes(memory)} of physical memory"


def exceeds_memory(nbytes: int) -> bool:
    """Whether ``nbytes`` is more than the memory this process may use (False where it is unknown)."""
    usable, _ = _usable()
    return usable is not None and nbytes > usable


def format_bytes(nbytes: float) -> str:
    """``nbytes`` in binary units, e.g. ``"23.5 GiB"``."""
    value = float(nbytes)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB", "PiB"):
        if value < 1024 or unit == "PiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    raise AssertionError("unreachable")


def memory_phrase() -> str:
    """``"this machine's 23.5 GiB of physical memory"`` (or the address-space limit, where lower) for an
    error message."""
    return _usable()[1]
