"""Asynchronous Parallel: every push is its own optimizer step, nobody waits.

Hogwild-style parameter-server training (Dean et al., "Large scale distributed deep networks",
NIPS 2012; docs/design.md "Synchronization models"): the server applies each gradient on arrival and
answers the pusher's pull at once, so staleness is unbounded.
"""

from __future__ import annotations

from .base import Decision, SyncPolicy


class ASP(SyncPolicy):
    """Asynchronous Parallel over ``workers`` workers: the pusher is released at once.

    Parameters
    ----------
    workers : int
        Number of workers.
    """

    name = "asp"

    def _decide_push(self, worker: int, t: float) -> Decision:
        return self._alone[worker]
