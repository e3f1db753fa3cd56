"""``sync.zipline_z = "auto"``: robust ZipLine's z chosen online from the observed waiting.

The waiting a barrier causes is its observed spread: the first member to arrive waits that long for
the last. Robust ZipLine promised at most the *interval spread* of its choice, ``max(M + zσ) −
min(M − zσ)``. The ratio observed / interval spread says whether the intervals were too narrow for
the waiting that came (> 1) or wide enough (<= 1); it falls as z grows, and it is a much steadier
signal than the waiting share itself, which the slow phases of a few workers swing by tens of per
cent from one barrier to the next (docs/simulation.md, "ZipLine under uncertainty").

The rule, over the grid :data:`GRID`:

- z starts at 0 (the paper's ZipLine, whose interval spread is its predicted spread);
- after every ``window`` counted barriers, if the median of their ratios exceeds ``1 + hysteresis``
  z moves one step up the grid; otherwise it stays.

Why it cannot oscillate: z never moves down, and the grid is finite, so z changes at most
``len(GRID) − 1`` times in a run, whatever the waiting does. The median of a window ignores a single
barrier that a slow phase blew up, and the hysteresis keeps z where its intervals already cover the
waiting up to noise. The price of one-way moves: a run whose jitter later falls keeps the wider
intervals it needed before (the measured cost of a z too large by one step is small; see the study).
"""

from __future__ import annotations

import math
import statistics

#: the z tried, in order
GRID = (0.0, 0.5, 1.0, 1.5, 2.0, 2.5, 3.0)


class AutoZ:
    """The z of robust ZipLine, updated after every barrier.

    Parameters
    ----------
    window : int
        Barriers whose median ratio decides one step (>= 1).
    hysteresis : float
        z moves up only where the observed spread exceeds the interval spread by more than this
        share (>= 0).
    grid : sequence of float
        The z tried, increasing, from the first.
    """

    def __init__(self, window: int = 3, hysteresis: float = 0.1, grid=GRID):
        if int(window) != window or window < 1:
            raise ValueError(f"AutoZ window must be an integer >= 1, got {window}")
        if not (math.isfinite(hysteresis) and hysteresis >= 0.0):
            raise ValueError(f"AutoZ hysteresis must be finite and >= 0, got {hysteresis}")
        grid = tuple(float(z) for z in grid)
        if not grid or any(not (math.isfinite(z) and z >= 0) for z in grid) or list(grid) != sorted(set(grid)):
            raise ValueError(f"AutoZ grid must be increasing finite z >= 0, got {grid}")
        self.window, self.hysteresis, self.grid = int(window), float(hysteresis), grid
        self._at = 0
        self._ratios: list[float] = []
        self._barriers = 0
        #: every change of z: (barriers observed at the change, new z)
        self.changes: list[tuple[int, float]] = []

    @property
    def z(self) -> float:
        """The z to use for the next barrier decision."""
        return self.grid[self._at]

    def observe(self, observed_spread: float, interval_spread: float) -> float:
        """Feed one barrier: its observed spread and the interval spread it was chosen with (seconds);
        returns the z to use next. A barrier without an interval (interval spread 0, or NaN values,
        as before any error was learned or when one member arrived) is not counted."""
        self._barriers += 1
        if not (math.isfinite(observed_spread) and math.isfinite(interval_spread) and interval_spread > 0):
            return self.z
        self._ratios.append(observed_spread / interval_spread)
        if len(self._ratios) < self.window:
            return self.z
        ratio = statistics.median(self._ratios)
        self._ratios = []
        if ratio > 1.0 + self.hysteresis and self._at + 1 < len(self.grid):
            self._at += 1
            self.changes.append((self._barriers, self.z))
        return self.z
