"""``sync.replan = "overdue"``: ElasticBSP moves a barrier that turned out wrong (docs/design.md,
"Re-planned barriers").

A barrier is decided on predictions. When a member then pushes so late that the members already held
would wait longer than the barrier promised (its interval spread), the server still holds their pulls,
so it may plan again: ZipLine over what is left of the lookahead, with the late push as new evidence.
The held members are released and, like every member, get a new barrier push; the barrier only moves
if the new plan promises the held members less waiting than the old one now costs them.

Staleness: a worker's pushes since the decision (``done_since``) plus the re-plan's lookahead never
exceed R, so no worker pushes more than R times between a decision and the barrier that holds it,
however often the barrier moves: the bound of ElasticBSP is kept (ICDM 2019, Sec. 4).

The pure parts live here (what the late push projects, the matrix ZipLine is run on again, whether
the new plan is taken); :class:`~ebsp_mpi.sync.elastic.ElasticBSP` carries them out.
"""

from __future__ import annotations

import numpy as np

#: what ElasticBSP does when a member's push shows its barrier will cost more waiting than it promised
REPLAN = ("none", "overdue")


def late_pace(interval: float, latest_interval: float) -> float:
    """The interval a member that pushed late is taken to go on at (seconds per iteration): the slower
    of its predicted interval and the one it just took. The late push is evidence: a worker that
    entered a slow phase keeps its new pace for a while, which the EMA alone would weigh at alpha."""
    return max(interval, latest_interval)


def projected_arrival(t: float, remaining: int, pace: float) -> float:
    """When a member that pushed at `t` reaches its barrier, `remaining` pushes later at `pace`."""
    return t + remaining * pace


def barrier_turned_wrong(first_arrival: float, projected: float, promised_spread: float) -> bool:
    """Whether the first member to arrive will wait longer than the barrier promised: the projected
    last arrival minus the first arrival exceeds the promised (interval) spread."""
    return projected - first_arrival > promised_spread


def replan_lookahead(R: int, done_since: np.ndarray) -> int:
    """Pushes per member the re-plan may choose from: what every member has left of R since the
    decision (0: some member is at R already, and the barrier cannot move without breaking the bound)."""
    return int(R - done_since.max()) if done_since.size else 0


def replan_matrix(M: np.ndarray, t: float, held: np.ndarray, held_rate: np.ndarray,
                  late: int, late_rate: float) -> np.ndarray:
    """The predictions ZipLine is run on again, shape of `M` (its rows: every member, k = 1..R').

    `M` holds the predictor's rows from each member's latest push (a member still computing). A held
    member starts its next iteration when released, at `t`: its row is ``t + k · rate``; so is the
    `late` member's, which pushed at `t`, at ``late_rate`` (:func:`late_pace`).
    """
    k = np.arange(1, M.shape[1] + 1, dtype=np.float64)
    M = M.copy()
    M[held] = t + held_rate[:, None] * k[None, :]
    M[late] = t + late_rate * k
    return M


def worth_replanning(projected: float, t: float, new_promised_spread: float) -> bool:
    """Take the new plan when it promises the held members less waiting (its interval spread) than
    the old barrier now costs them (from `t` to the projected last arrival)."""
    return new_promised_spread < projected - t
