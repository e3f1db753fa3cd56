"""A deadline on ``MPI_Init`` that names the likely cause (docs/reliability.md, "No hang without a
deadline"). Standard library only: it runs before MPI starts.

A rank can wait in ``MPI_Init`` forever, printing nothing. One cause is the project's own: MPICH
requires every rank of a node to use the same shared-memory settings (``transport.env.MPICH_SHM_VARS``),
and a rank given its own ``MPIR_CVAR_*`` (an MPMD launch's ``-env`` for one executable) keeps MPICH's
defaults for all four while the others set them; MPICH then hangs in its shared-memory bootstrap.
Others: a requeued Slurm job meeting the shared memory its killed first start left behind, a process
manager that never answers.

No Python code runs while the main thread is inside the MPI library, and ranks cannot compare their
settings before MPI is up. So a watcher process is forked before ``MPI_Init`` (where forking is safe):
past the deadline it prints one line naming this rank's MPICH settings and where they came from, and
kills the rank, which makes the launcher end the job. Once ``MPI_Init`` returns, the rank closes the
pipe the watcher waits on and the watcher exits.
"""

from __future__ import annotations

import os
import select
import signal
import sys

from ..transport.env import MPICH_SHM_VARS


def mpich_settings(env=None) -> str:
    """This rank's ``MPIR_CVAR_*`` settings as one phrase, saying which are the project's
    (:data:`~ebsp_mpi.runtime.transport.env.MPICH_SHM_VARS`) and which another's."""
    env = os.environ if env is None else env
    given = sorted(var for var in env if var.startswith("MPIR_CVAR_"))
    if not given:
        return "none set (MPICH's defaults)"
    ours = all(env.get(var) == value for var, value in MPICH_SHM_VARS.items()) and \
        set(given) == set(MPICH_SHM_VARS)
    listed = ", ".join(f"{var}={env[var]}" for var in given)
    whose = "the project's own" if ours else "not the project's set of four"
    return f"{listed} ({whose})"


def init_timeout_line(rank: int, timeout_s: float, env=None) -> str:
    """The one line a rank stuck in ``MPI_Init`` prints."""
    return (f"ebsp_mpi: error: rank {rank}: MPI_Init has not returned after {timeout_s:g} s (EBSP_MPI_INIT_TIMEOUT_S); "
            f"MPICH waits there for ever when the ranks of a node differ in their MPIR_CVAR_* settings (an MPMD "
            f"launch giving one rank its own), and this rank's are: {mpich_settings(env)}; give every rank the same "
            f"MPIR_CVAR_* or none")


class InitWatch:
    """A forked watcher of this process's ``MPI_Init`` (the module docstring); :meth:`done` once it
    returned. Where ``fork`` is missing, nothing is watched."""

    def __init__(self, timeout_s: float, line: str):
        self.pid, self.pipe = None, None
        if not hasattr(os, "fork"):
            return
        read, write = os.pipe()
        pid = os.fork()
        if pid == 0:  # the watcher: only async-signal-safe calls from here on
            os.close(write)
            try:
                ready, _, _ = select.select([read], [], [], timeout_s)
                if not ready:
                    os.write(sys.__stderr__.fileno() if sys.__stderr__ else 2, (line + "\n").encode(errors="replace"))
                    os.kill(os.getppid(), signal.SIGKILL)
            finally:
                os._exit(0)
        os.close(read)
        self.pid, self.pipe = pid, write

    def done(self) -> None:
        """``MPI_Init`` returned (or failed): the watcher exits, and is reaped."""
        if self.pid is None:
            return
        os.close(self.pipe)
        os.waitpid(self.pid, 0)
        self.pid = None
