"""Termination requests (SIGTERM, and SIGINT once a training run takes it): noted, so that the run
stops cleanly at its next pull instead of dying."""

from __future__ import annotations

import signal

from ...stop_signals import StopSignals

#: SIGTERM noted here from :func:`~.start.setup` on; SIGINT (Ctrl-C) too once a training run takes it
#: (:func:`take_ctrl_c`: a benchmark still dies of it)
stop_signals = StopSignals()


def note_termination_requests() -> None:
    """Take SIGTERM as a request to stop cleanly rather than die: Slurm sends it to every task before a
    time limit or a preemption (``--signal``). The server then checkpoints and stops the workers at
    their next pull (:func:`terminate_requested`); a worker goes on until the server stops it."""
    stop_signals.install(signal.SIGTERM)


def take_ctrl_c() -> None:
    """Take SIGINT as SIGTERM: a terminal's Ctrl-C sends it to every rank (and MPICH's mpiexec once
    more), and a training run then stops as after SIGTERM, exiting 130 (:mod:`ebsp_mpi.stop_signals`)."""
    stop_signals.install(signal.SIGINT)


def terminate_requested() -> bool:
    """SIGTERM or SIGINT has come to this process."""
    return bool(stop_signals)
