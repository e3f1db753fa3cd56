"""Synchronization models as pure policies over push events (no MPI, no clock of their own).

The same objects drive the live parameter server, the unit tests (scripted event sequences) and the
discrete-event simulator (:mod:`ebsp_mpi.sim.events`). See :mod:`.base` for the protocol and docs/design.md
("Synchronization models") for the semantics each model holds.
"""

from .base import Decision, Record, SyncPolicy
from .registry import POLICIES, make_policy
from .zipline import RobustZipLineResult, ZipLineResult, zipline, zipline_brute, zipline_robust

__all__ = ["Decision", "Record", "SyncPolicy", "POLICIES", "make_policy", "ZipLineResult", "zipline",
           "zipline_brute", "RobustZipLineResult", "zipline_robust"]
