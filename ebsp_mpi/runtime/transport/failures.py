"""The ways a run is expected to fail, each reported in one line by ``rank.abort`` (no traceback)."""

from __future__ import annotations


class JobFailure(RuntimeError):
    """An expected way for a run to fail (a stalled worker): reported in one line, no traceback."""


class StallError(JobFailure):
    """A rank that owes this one a message has been silent longer than ``runtime.stall_timeout_s``.

    `ranks` are the silent ranks, where the one that raises knows them: ``rank.abort.abort`` names the other
    ranks of their nodes too (``rank.abort.node_note``), which a lost node takes with it."""

    def __init__(self, text: str, ranks=()):
        super().__init__(text)
        self.ranks = tuple(int(r) for r in ranks)


class PeerFailure(JobFailure):
    """The launcher reported a dead rank, and this rank found which one."""
