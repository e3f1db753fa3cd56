"""Bulk Synchronous Parallel: one optimizer step per round, everyone waits for the slowest.

Round c is complete when every active worker has pushed its c-th gradient. The server keeps each
worker's gradient of the round as it arrives (the policy is ``round_based``); when the round completes
it averages them (summed in worker order, ``nn.average.round_mean``), applies the mean as one optimizer
step and answers every held pull with the same new weights (Valiant,
"A bridging model for parallel computation", CACM 1990; docs/design.md "Synchronization models").
"""

from __future__ import annotations

from .base import NOTHING, Decision, SyncPolicy


class BSP(SyncPolicy):
    """Bulk Synchronous Parallel over ``workers`` workers.

    A push is held until every active worker has pushed the same round; the last push of the round
    releases all active workers together with ``apply_round=True``. A worker that leaves completes the
    round when all the others have already pushed it (its gradients already pushed stay in the
    server's round). Each completed round counts as one barrier. BSP writes no trace rows of its own.

    Parameters
    ----------
    workers : int
        Number of workers.
    """

    name = "bsp"
    round_based = True

    def _decide_push(self, worker: int, t: float) -> Decision:
        return self._close_round_if_complete()

    def _decide_leave(self, worker: int, t: float) -> Decision:
        return self._close_round_if_complete()

    def _close_round_if_complete(self) -> Decision:
        # A held worker cannot push again, so "every active worker is held" means every active
        # worker has pushed the current round and no more. The held workers are always active (a
        # departure drops its worker from both), so comparing the counts is enough: O(1) per push.
        if self.active and len(self.held) == len(self.active):
            self.barriers += 1
            return Decision(release=self.active_sorted(), apply_round=True)
        return NOTHING
