"""The signals that ask a run to stop cleanly: SIGTERM (Slurm sends it before a time limit or a
preemption) and SIGINT (Ctrl-C at a terminal, which goes to the launcher's whole process group, ranks
included; MPICH's mpiexec forwards it to them once more). Either one makes the run checkpoint and end
at once, as a finished run does; Ctrl-C then exits with 130, as a shell reports a command that Ctrl-C
stopped, so that a script can tell an interrupted run from a finished one.
"""

from __future__ import annotations

import signal

#: the exit code of a run stopped by Ctrl-C (128 + SIGINT, the shell's convention)
EXIT_INTERRUPTED = 128 + signal.SIGINT


class StopSignals:
    """Notes SIGTERM and SIGINT instead of dying of them (:meth:`install`); true once one came."""

    def __init__(self):
        self.received: list[int] = []
        self.previous: dict[int, object] = {}

    def install(self, *signals: int) -> StopSignals:
        """Note `signals` (default SIGTERM and SIGINT) from now on; a signal noted already stays so."""
        for sig in signals or (signal.SIGTERM, signal.SIGINT):
            if sig not in self.previous:
                self.previous[sig] = signal.signal(sig, self._note)
        return self

    def restore(self) -> None:
        """Give the signals back their handlers of before :meth:`install`."""
        for sig, handler in self.previous.items():
            signal.signal(sig, handler)
        self.previous = {}

    def _note(self, signum, frame) -> None:
        self.received.append(signum)

    def __bool__(self) -> bool:
        return bool(self.received)

    @property
    def interrupted(self) -> bool:
        """Ctrl-C (SIGINT) came."""
        return signal.SIGINT in self.received

    @property
    def name(self) -> str:
        """What stopped the run, for its one line."""
        return "Ctrl-C (SIGINT)" if self.interrupted else "SIGTERM"

    @property
    def exit_code(self) -> int:
        """:data:`EXIT_INTERRUPTED` after Ctrl-C, else 0 (SIGTERM, or no signal: the run ended)."""
        return EXIT_INTERRUPTED if self.interrupted else 0
