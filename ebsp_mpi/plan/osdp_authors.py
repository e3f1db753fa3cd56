"""The OSDP authors' planning problem on their own profile, solved exactly (a test vector for the idea).

The authors' profile (``gpt_block_profile.json``, from their repository's ``profiler_output.py``)
gives, per hidden size, batch row (0..4, increasing batch) and strategy (0: nothing sharded, 1: the
attention linears sharded, 2: the MLP linears sharded, 3: both), the memory in MB and the time in
seconds of ONE transformer block. Their planner, for a model of B identical blocks on a device of
L MB:

- every block runs at the same batch row;
- memory counts in whole MB: each block's value truncated to an integer, the sum at most
  ``L − extra_overhead_mb`` (800);
- a strategy per block minimising the summed time.

Since the blocks are identical, a plan is the number of blocks at each strategy, four counts summing
to B. This module finds the least summed time exactly in O(B²) steps, not by trying all
``(B+1)(B+2)(B+3)/6`` splits (cubic: 400 blocks took 23 s): for each count at strategies 2 and 3, the
rest is split between strategies 0 and 1, where the time is linear in the count at 0 and the memory
bounds it to an interval, so one end of that interval is best (:func:`_least_time`, in NumPy over the
counts at strategy 2). At :data:`MAX_BLOCKS` blocks a row takes about a second on a busy 2-core
machine; more is refused in one line. The released scheduler tries rows 1, 2, 3 in turn, stops at the
first infeasible one and keeps the row of least summed time (:func:`authors_row`); that is not the row
of most throughput (batch / time), which :func:`best_row` finds, with the batch of each row given (by
default the row number itself, the batch size the authors' scheduler prints for it; row 0 then has none).
Pure: the standard library and NumPy.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..errors import UsageError

STRATEGIES = 4
#: The most blocks :func:`solve` plans (O(B²) work per row; GPT models have tens of blocks).
MAX_BLOCKS = 5_000
#: The rows the released scheduler tries, in order (it stops at the first infeasible one).
AUTHORS_ROWS = (1, 2, 3)


class ProfileError(UsageError, ValueError):
    """An authors' profile file that cannot be used (one line naming the file and the problem)."""


@dataclass(frozen=True)
class Solution:
    """The least summed time at one row, or ``feasible = False``."""

    row: int
    feasible: bool
    budget_mb: int
    time_s: float = math.inf
    memory_mb: int = 0
    counts: tuple[int, ...] = ()

    def as_dict(self) -> dict:
        out = {"feasible": self.feasible, "row": self.row, "budget_mb": self.budget_mb}
        if self.feasible:
            out.update(time_s=self.time_s, memory_mb=self.memory_mb,
                       strategy_counts={f"s{k}": n for k, n in enumerate(self.counts)})
        return out


def read_profile(path: str | Path) -> dict:
    """The profile in `path`, its shape checked (hidden sizes × rows × 4 strategies of numbers)."""
    p = Path(path)
    try:
        data = json.loads(p.read_text())
    except FileNotFoundError:
        raise ProfileError(f"--osdp-profile {p}: not found") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ProfileError(f"--osdp-profile {p}: not a readable JSON file ({e})") from None
    if not isinstance(data, dict) or not {"hidden_sizes", "mem_mb", "time_s"} <= set(data):
        raise ProfileError(f"--osdp-profile {p}: expected an object with hidden_sizes, mem_mb and time_s")
    hidden = data["hidden_sizes"]
    for key in ("mem_mb", "time_s"):
        table = data[key]
        ok = (isinstance(table, list) and len(table) == len(hidden)
              and all(isinstance(rows, list) and rows and len(rows) == len(table[0]) for rows in table)
              and all(isinstance(r, list) and len(r) == STRATEGIES
                      and all(isinstance(v, (int, float)) and math.isfinite(v) and v >= 0 for v in r)
                      for rows in table for r in rows))
        if not ok:
            raise ProfileError(f"--osdp-profile {p}: {key} must be [hidden size][row][{STRATEGIES} strategies] "
                               f"of finite numbers >= 0, for {len(hidden)} hidden sizes")
    return data


def rows_of(profile: dict) -> int:
    return len(profile["mem_mb"][0])


def solve(profile: dict, blocks: int, hidden: int, memory_mb: int, row: int) -> Solution:
    """The authors' problem at one row, exactly: the counts per strategy of least summed time (among
    equal times, the fewest blocks at strategy 0, then 1, then 2).

    Raises
    ------
    ProfileError
        An unknown hidden size or row, or more than :data:`MAX_BLOCKS` blocks (one line).
    """
    h = _hidden_index(profile, hidden)
    if not 0 <= row < rows_of(profile):
        raise ProfileError(f"--row {row}: the profile has rows 0..{rows_of(profile) - 1}")
    if not 1 <= blocks <= MAX_BLOCKS:
        raise ProfileError(f"--blocks {blocks}: plans 1 to {MAX_BLOCKS} blocks (the exact search takes "
                           f"blocks² steps per row)")
    budget = memory_mb - int(profile.get("extra_overhead_mb", 800))
    mem = [math.trunc(v) for v in profile["mem_mb"][h][row]]
    time = profile["time_s"][h][row]
    counts = _least_time(blocks, mem, time, budget)
    if counts is None:
        return Solution(row, False, budget)
    used = sum(n * m for n, m in zip(counts, mem, strict=True))
    return Solution(row, True, budget, math.fsum(n * t for n, t in zip(counts, time, strict=True)), used, counts)


def _least_time(blocks: int, mem: Sequence[int], time: Sequence[float], budget: int) -> tuple[int, ...] | None:
    """Counts (n0, n1, n2, n3) summing to `blocks` with ``Σ n_k mem_k <= budget`` and the least
    ``Σ n_k time_k``; among times equal to rounding, the smallest (n0, n1, n2); None if none fits.

    For each n3 (a loop) and every n2 (an array), the R = blocks - n2 - n3 remaining blocks go to
    strategies 0 and 1: with n0 of them at 0 the memory is ``R·m1 + n0·(m0 - m1)``, at most the budget
    left, which bounds n0 to an interval of [0, R], and the time ``R·t1 + n0·(t0 - t1)`` is least at its
    upper end when t0 < t1, else at its lower end.
    """
    m0, m1, m2, m3 = (int(m) for m in mem)
    t0, t1, t2, t3 = (float(t) for t in time)
    budget = min(int(budget), blocks * max(mem))  # a larger budget changes nothing, and stays in int64
    best: list[tuple[float, int, int, int, int]] = []  # per n3: its least time and counts
    for n3 in range(blocks + 1):
        n2 = np.arange(blocks - n3 + 1, dtype=np.int64)
        rest = blocks - n3 - n2
        left = budget - n3 * m3 - n2 * m2 - rest * m1  # memory left with all R blocks at strategy 1
        if m0 > m1:
            lo, hi = np.zeros_like(rest), np.minimum(rest, np.floor_divide(left, m0 - m1))
        elif m0 < m1:
            lo, hi = np.maximum(0, -np.floor_divide(left, m1 - m0)), rest  # ceil(-left / (m1 - m0))
        else:
            lo, hi = np.zeros_like(rest), np.where(left >= 0, rest, -1)
        fits = lo <= hi
        if not fits.any():
            continue
        n2, rest, n0 = n2[fits], rest[fits], (hi if t0 < t1 else lo)[fits]
        cost = n0 * t0 + (rest - n0) * t1 + n2 * t2 + n3 * t3
        tied = np.flatnonzero(cost <= cost.min() * (1 + 1e-12))
        k = tied[np.lexsort((n2[tied], rest[tied] - n0[tied], n0[tied]))[0]]
        best.append((float(cost[k]), int(n0[k]), int(rest[k] - n0[k]), int(n2[k]), n3))
    if not best:
        return None
    least = min(b[0] for b in best)
    return min(b[1:] for b in best if b[0] <= least * (1 + 1e-12))


def authors_row(profile: dict, blocks: int, hidden: int, memory_mb: int) -> Solution | None:
    """The row the released scheduler takes: of rows 1, 2, 3 up to the first infeasible one, the least
    summed time; None when row 1 is infeasible already (the scheduler then has no plan)."""
    found = []
    for row in AUTHORS_ROWS:
        if row >= rows_of(profile):
            break
        s = solve(profile, blocks, hidden, memory_mb, row)
        if not s.feasible:
            break
        found.append(s)
    return min(found, key=lambda s: s.time_s) if found else None


def best_row(profile: dict, blocks: int, hidden: int, memory_mb: int,
             row_batches: Sequence[float]) -> tuple[Solution | None, list[Solution]]:
    """The feasible row of most samples per second (``row_batches[row] / time``), and every row's
    solution; rows with batch 0 are never chosen."""
    if len(row_batches) != rows_of(profile):
        raise ProfileError(f"--row-batches: {len(row_batches)} values for the profile's {rows_of(profile)} rows")
    solutions = [solve(profile, blocks, hidden, memory_mb, r) for r in range(rows_of(profile))]
    candidates = [s for s in solutions if s.feasible and row_batches[s.row] > 0]
    best = max(candidates, key=lambda s: row_batches[s.row] / s.time_s) if candidates else None
    return best, solutions


def _hidden_index(profile: dict, hidden: int) -> int:
    try:
        return profile["hidden_sizes"].index(hidden)
    except ValueError:
        raise ProfileError(f"--hidden {hidden}: the profile has hidden sizes "
                           f"{', '.join(map(str, profile['hidden_sizes']))}") from None
