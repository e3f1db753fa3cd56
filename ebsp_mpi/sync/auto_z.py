"""``sync.zipline_z = "auto"``: robust ZipLine's z chosen online from the observed waiting.

The figure of merit is the *waiting share* of a superstep: the time the members of a barrier spent
held there, over the workers' time in the superstep (members × the time from the previous release to
this one). Monitoring, where nobody waits, is part of the superstep, so a z that buys a shorter wait
with shorter supersteps (more barriers) is charged for them.

The search is a one-way climb over the grid :data:`GRID`, with hysteresis:

1. Start at z = 0 (the paper's ZipLine) and average the waiting share over ``window`` barriers.
2. Try the next z of the grid for ``window`` barriers. If its mean is below the current one by more
   than the factor ``1 − hysteresis``, keep it and go on to the next; otherwise go back to the
   current z and stop searching.
3. After the last step (or the last z of the grid) z never changes again.

Why it cannot oscillate: z only moves up the grid, except for the one step back that ends the search,
so it changes at most ``2 · len(GRID)`` times in a run, whatever the waiting does. The hysteresis
keeps a noisy window from moving z up where the gain is within the noise: a step must cut the mean
waiting by ``hysteresis`` (relative) to be kept. The price is that a run whose best z changes later
(a straggler appears after the search ended) keeps the z it settled on.
"""

from __future__ import annotations

import math

#: the z tried, in order
GRID = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0)


class AutoZ:
    """The z of robust ZipLine, updated after every barrier.

    Parameters
    ----------
    window : int
        Barriers averaged per z tried (>= 1).
    hysteresis : float
        Relative cut of the mean waiting share a larger z must bring to be kept, in [0, 1).
    grid : sequence of float
        The z tried, increasing, from the first.
    """

    def __init__(self, window: int = 4, hysteresis: float = 0.05, grid=GRID):
        if int(window) != window or window < 1:
            raise ValueError(f"AutoZ window must be an integer >= 1, got {window}")
        if not 0.0 <= hysteresis < 1.0:
            raise ValueError(f"AutoZ hysteresis must be in [0, 1), got {hysteresis}")
        grid = tuple(float(z) for z in grid)
        if not grid or any(not (math.isfinite(z) and z >= 0) for z in grid) or list(grid) != sorted(set(grid)):
            raise ValueError(f"AutoZ grid must be increasing finite z >= 0, got {grid}")
        self.window, self.hysteresis, self.grid = int(window), float(hysteresis), grid
        self._at = 0               # index of the z in use
        self._kept: float | None = None  # mean waiting share of the z kept so far (None: still measuring it)
        self._shares: list[float] = []
        self.settled = len(grid) == 1
        #: every change of z: (barrier count at the change, new z)
        self.changes: list[tuple[int, float]] = []
        self._barriers = 0

    @property
    def z(self) -> float:
        """The z to use for the next barrier decision."""
        return self.grid[self._at]

    def observe(self, waiting_share: float) -> float:
        """Feed one barrier's waiting share (in [0, 1]; NaN is ignored); returns the z to use next."""
        self._barriers += 1
        if self.settled or not math.isfinite(waiting_share):
            return self.z
        self._shares.append(float(waiting_share))
        if len(self._shares) < self.window:
            return self.z
        mean = sum(self._shares) / len(self._shares)
        self._shares = []
        if self._kept is None:  # the first z measured
            self._kept = mean
            self._move(self._at + 1)
        elif mean < self._kept * (1.0 - self.hysteresis):  # the step up paid: keep it, try the next
            self._kept = mean
            self._move(self._at + 1)
        else:  # it did not: back to the kept z, for good
            self._move(self._at - 1)
            self.settled = True
        return self.z

    def _move(self, at: int) -> None:
        if at >= len(self.grid):  # the grid's end: stay on its last z
            self.settled = True
            return
        self._at = at
        self.changes.append((self._barriers, self.z))
