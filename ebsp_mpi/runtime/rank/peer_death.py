"""A dead peer named: the launcher's notice that a rank died (SIGUSR1 under Hydra) turned into the
line that says which rank, instead of every survivor vanishing without a word."""

from __future__ import annotations

import logging
import os
import signal
import socket
import time

from ..transport.context import role_name
from ..transport.failures import PeerFailure

log = logging.getLogger(__name__)

#: called (on rank 0) when the launcher signals that a process failed; see :func:`watch_peers`
_peers: list[tuple[str, int]] = []
_servers = [1]  # runtime.servers of the job, to name a dead rank's role


def survive_peer_failure_notices() -> None:
    """Keep running when the launcher announces that another rank died, and name the dead rank.

    MPICH's Hydra, run with ``-disable-auto-cleanup``, sends SIGUSR1 to the surviving ranks when one
    dies. Python's default action for SIGUSR1 ends the process, so every survivor would vanish without a
    word. Instead rank 0 looks up which rank's process is gone (those on its own node, by PID) and raises
    ``transport.failures.PeerFailure`` naming it, which aborts the job; for ranks on other nodes the server's watchdog
    names the silent worker after ``runtime.stall_timeout_s``.
    """
    if not hasattr(signal, "SIGUSR1"):
        return

    def notice(signum, frame):
        here = [rank for rank, (host, _) in enumerate(_peers) if host == socket.gethostname()]
        for _ in range(50):  # the notice can come while the dead process is still being torn down
            dead = [rank for rank in here if _process_gone(_peers[rank][1])]
            if dead or not here:
                break
            time.sleep(0.01)
        if dead:
            raise PeerFailure("; ".join(f"rank {r} ({role_name(r, _servers[0])}, pid "
                                        f"{_peers[r][1]} on {_peers[r][0]}) died" for r in dead))
        log.warning("the MPI launcher signalled a failed process (SIGUSR1); the server's watchdog names a "
                    "silent worker after runtime.stall_timeout_s")

    signal.signal(signal.SIGUSR1, notice)


def watch_peers(procs: list[tuple[str, int]], servers: int = 1) -> None:
    """Remember the (host, pid) of the ranks this one watches (rank 0 every rank, the others the
    servers), by rank, to name a dead one when the launcher signals it."""
    _peers[:] = procs
    _servers[0] = servers


def _process_gone(pid: int) -> bool:
    """True when `pid` no longer runs (exited, or a zombie its parent has not reaped yet)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] in ("Z", "X")
    except FileNotFoundError:
        return True
    except OSError:  # no /proc (macOS): signal 0 only tells whether the PID exists
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        return False
