"""Before ``MPI_Init``: do the ranks of this node agree on their ``MPIR_CVAR_*`` settings?
(docs/reliability.md, "No hang without a deadline"). Standard library only: MPI is not up yet.

MPICH needs every rank of a node to use the same shared-memory settings; when they differ (an MPMD
launch whose ``-env`` gives one executable its own ``MPIR_CVAR_*``), ``MPI_Init`` hangs, or aborts
with ``MPIDI_POSIX_comm_bootstrap: Out of memory``, by chance. The ranks cannot talk before
``MPI_Init``, but those of a node share ``/dev/shm`` and, under MPICH's Hydra, a parent (the node's
``hydra_pmi_proxy``) and ``MPI_LOCALNRANKS``: each rank writes its settings to a file named after that
parent, reads the others', and when they differ the node's first rank prints one line naming the
variables and every rank exits with code 2, before ``MPI_Init``. A rank whose peers have not written
within :data:`WAIT_S` goes on unchecked (the ``MPI_Init`` deadline, ``rank.init_watch``, still holds).
Elsewhere (Open MPI, srun, no ``/dev/shm``) nothing is checked.

A rank removes its file once ``MPI_Init`` has returned (every peer has read it by then). A launch
refused here leaves its files (one of some 300 bytes per rank: a rank cannot know when its peers have
read it); each check removes those of launcher processes that are gone.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

from ...safe_text import ascii_digits
from ..transport.env import world_size_from_env

#: seconds a rank waits for the other ranks of its node to write their settings
WAIT_S = 5.0
SHM = Path("/dev/shm")


def _settings(env) -> dict:
    return {var: env[var] for var in sorted(env) if var.startswith("MPIR_CVAR_")}


def _job_key(parent: int | None = None) -> str | None:
    """The node's launcher process of this job: its PID and start time (a PID alone may be reused)."""
    parent = os.getppid() if parent is None else parent
    try:
        start = Path(f"/proc/{parent}/stat").read_text().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return None
    return f"{parent}-{start}"


def _remove_stale() -> None:
    """Remove the files of launches whose launcher process is gone (those refused here)."""
    for path in SHM.glob("ebsp-mpi-cvars-*"):
        pid, start = (path.name.split("-") + ["", "", "", "", ""])[3:5]
        if ascii_digits(pid) and _job_key(int(pid)) != f"{pid}-{start}":
            forget([path])


def disagreement(env=None, wait_s: float = WAIT_S) -> tuple[str | None, list[Path]]:
    """(the one line naming the settings the ranks of this node differ in, or None; the files written,
    for :func:`forget`)."""
    env = os.environ if env is None else env
    count, mine = env.get("MPI_LOCALNRANKS", ""), env.get("MPI_LOCALRANKID", "")
    if not (ascii_digits(count) and ascii_digits(mine)) or not int(mine) < int(count) <= world_size_from_env(env):
        return None, []  # not Hydra's, or values no launch of this size gives: nothing to compare
    key = _job_key()
    if int(count) < 2 or key is None or not SHM.is_dir():
        return None, []
    _remove_stale()
    paths = [SHM / f"ebsp-mpi-cvars-{key}-{r}" for r in range(int(count))]
    own = paths[int(mine)]
    try:
        tmp = own.with_suffix(".tmp")
        tmp.write_text(json.dumps(_settings(env)))
        os.replace(tmp, own)
    except OSError:
        return None, []
    deadline = time.monotonic() + wait_s
    while not all(p.exists() for p in paths):
        if time.monotonic() > deadline:
            return None, [own]
        time.sleep(0.002)
    try:
        found = [json.loads(p.read_text()) for p in paths]
    except (OSError, ValueError):
        return None, [own]
    if all(f == found[0] for f in found):
        return None, [own]
    differ = sorted({var for f in found for var in f if any(g.get(var) != f.get(var) for g in found)})
    shown = "; ".join(f"{var}: " + ", ".join(f"local rank {r} {f.get(var, 'unset')}" for r, f in enumerate(found))
                      for var in differ)
    return (f"the ranks of this node differ in their MPICH settings, with which MPI_Init hangs or fails: {shown}; "
            f"give every rank the same MPIR_CVAR_* (an MPMD launch's -env sets them for one executable only), or "
            f"none"), [own]


def forget(paths: list[Path]) -> None:
    """Remove this rank's file (once ``MPI_Init`` is past: every peer has read it by then)."""
    for path in paths:
        try:
            path.unlink()
        except OSError:
            pass
