"""Fault injection for testing the failure paths: ``EBSP_INJECT_FAULT=RANK:WHEN[:MODE]``.

- ``RANK``: the rank that fails, a server (0..k-1, ``runtime.servers = k``) or a worker;
- ``WHEN``: on a worker, its 0-based iteration; on a server, the number of pushes it has taken in
  (the fault fires when it takes in that many); ``end`` on a worker: after its stop reply, before it
  reports its statistics; on the server: after the last worker has stopped, before the model is written;
  ``setup`` on any rank: once it has built its part of the job, before it reports its set-up;
  ``data`` on any rank: as its set-up starts, before it reads the data and makes the run's layout
  (before the ranks of its node agree on their window of pushes, ``transport.push_window``);
  ``flush`` on a worker: at the second reply that asks it to flush its trace (the server has written a
  checkpoint, its second), before it flushes;
- ``MODE``: ``raise`` (the default: an exception, which aborts the job), ``hang`` (the rank stops
  answering, as if stopped with SIGSTOP, which the watchdogs must name) or ``kill`` (the rank sends
  itself SIGKILL: nothing is flushed or cleaned up, as when Slurm or the OOM killer ends it).

Standard library only: the command line checks the variable before MPI starts (one line, exit code 2).
"""

from __future__ import annotations

import logging
import os
import signal
import time
from dataclasses import dataclass

from ...errors import UsageError
from ...safe_text import ascii_digits

log = logging.getLogger(__name__)

FAULT_ENV = "EBSP_INJECT_FAULT"
#: the moments a fault may name besides a count
WORDS = ("data", "setup", "end", "flush")
MODES = ("raise", "hang", "kill")


@dataclass(frozen=True)
class Fault:
    """A fault to inject on `rank`: at `when` (an iteration or push count, or one of :data:`WORDS`), by `mode`."""

    rank: int
    when: int | str
    mode: str = "raise"

    def due(self, count: int | str) -> bool:
        """True when `count` (this rank's iteration or push count, or one of :data:`WORDS`) is when it fires."""
        return self.when == count

    def fire(self, where: str) -> None:
        """Raise, hang for good or die of SIGKILL, at `where` (named in the message)."""
        if self.mode == "kill":
            log.warning("rank %d kills itself at %s (%s)", self.rank, where, FAULT_ENV)
            os.kill(os.getpid(), signal.SIGKILL)
        if self.mode == "hang":
            log.warning("rank %d hangs at %s (%s)", self.rank, where, FAULT_ENV)
            while True:
                time.sleep(3600)
        raise RuntimeError(f"fault injected at {where} ({FAULT_ENV})")


def parse_fault(spec: str, world_size: int, servers: int = 1) -> Fault | None:
    """The fault that `spec` (the variable's value) names, or None when it is empty.

    Raises
    ------
    UsageError
        When `spec` is malformed, names a rank outside ``0..world_size-1``, or puts ``flush`` (a
        worker's moment) on one of the `servers` server ranks of an MPI run, where it would never fire.
    """
    if not spec:
        return None
    parts = spec.split(":")
    if len(parts) not in (2, 3) or not ascii_digits(parts[0]) or not (ascii_digits(parts[1]) or parts[1] in WORDS) or \
            (len(parts) == 3 and parts[2] not in MODES):
        raise UsageError(f"{FAULT_ENV} = {spec!r}: expected RANK:WHEN or RANK:WHEN:MODE (RANK and WHEN numbers, "
                         f"WHEN may be {', '.join(WORDS)}; MODE {', '.join(MODES)})")
    rank = int(parts[0])
    if rank >= world_size:
        raise UsageError(f"{FAULT_ENV} = {spec!r}: rank {rank} does not exist; this job has ranks "
                         f"0..{world_size - 1}")
    if world_size == 1:
        raise UsageError(f"{FAULT_ENV} = {spec!r}: a fault is injected into a rank of an MPI run, and the "
                         f"single-process trainer has none; run it under mpiexec")
    if parts[1] == "flush" and rank < servers:
        raise UsageError(f"{FAULT_ENV} = {spec!r}: 'flush' is a worker's moment, and rank {rank} is a server "
                         f"(ranks 0..{servers - 1}); it would never fire")
    return Fault(rank, parts[1] if parts[1] in WORDS else int(parts[1]), parts[2] if len(parts) == 3 else "raise")


def fault_for(rank: int, world_size: int, env=None) -> Fault | None:
    """This rank's fault from the environment, or None."""
    fault = parse_fault((os.environ if env is None else env).get(FAULT_ENV, ""), world_size)
    return fault if fault is not None and fault.rank == rank else None
