"""The machine's physical memory, to refuse a dataset or a model that cannot fit before allocating it.

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


def exceeds_memory(nbytes: int) -> bool:
    """Whether ``nbytes`` is more than the physical memory (False where it is unknown)."""
    memory = physical_memory()
    return memory is not None and nbytes > memory


def format_bytes(nbytes: float) -> str:
    """``nbytes`` in binary units, e.g. ``"23.5 GiB"``."""
    value = float(nbytes)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB", "PiB"):
        if value < 1024 or unit == "PiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    raise AssertionError("unreachable")


def memory_phrase() -> str:
    """``"this machine's 23.5 GiB of physical memory"`` for an error message."""
    memory = physical_memory()
    return "this machine's physical memory" if memory is None else \
        f"this machine's {format_bytes(memory)} of physical memory"
