"""Learning-rate schedules: functions from the step number (counted from 0) to a learning rate."""

from __future__ import annotations

import math
from collections.abc import Callable

SCHEDULES = ("constant", "step", "cosine")


def make_schedule(kind: str, base_lr: float, *, total_steps: int | None = None,
                  warmup_steps: int = 0, step_size: int = 1000, gamma: float = 0.1,
                  min_lr: float = 0.0) -> Callable[[int], float]:
    """A learning-rate schedule ``lr(step)``.

    Parameters
    ----------
    kind : str
        ``"constant"``: ``base_lr``. ``"step"``: ``base_lr * gamma ** (step // step_size)``.
        ``"cosine"``: from ``base_lr`` at step 0 to ``min_lr`` at ``total_steps`` along half a cosine,
        ``min_lr + (base_lr - min_lr) * (1 + cos(pi * step / total_steps)) / 2`` (Loshchilov and
        Hutter, SGDR, ICLR 2017, eq. 5 without restarts), then ``min_lr``.
    base_lr : float
        Learning rate at step 0 (before warm-up).
    total_steps : int, optional
        Length of the cosine decay, in steps; required for ``"cosine"``.
    warmup_steps : int
        Linear warm-up (Goyal et al. 2017, section 2.2) multiplying any kind: the factor is
        ``(step + 1) / warmup_steps`` while ``step < warmup_steps``, so the first step is not
        wasted at lr 0 and step ``warmup_steps - 1`` reaches the full value.
    step_size : int
        Steps between decays of ``"step"``.
    gamma : float
        Decay factor of ``"step"``.
    min_lr : float
        Final value of ``"cosine"``.

    Raises
    ------
    ValueError
        For an unknown kind, a missing or non-positive ``total_steps`` with ``"cosine"``, or a
        negative or zero value where a positive one is needed (the message names it).
    """
    if kind not in SCHEDULES:
        raise ValueError(f"learning-rate schedule {kind!r} is unknown; allowed: {', '.join(SCHEDULES)}")
    base_lr, min_lr, gamma = float(base_lr), float(min_lr), float(gamma)
    _check_values(kind, base_lr, min_lr, total_steps, warmup_steps, step_size, gamma)

    def decayed(step: int) -> float:
        if kind == "constant":
            return base_lr
        if kind == "step":
            return base_lr * gamma ** (step // step_size)
        t = min(step, total_steps) / total_steps
        return min_lr + (base_lr - min_lr) * 0.5 * (1.0 + math.cos(math.pi * t))

    def schedule(step: int) -> float:
        if step < 0:
            raise ValueError(f"learning-rate schedule: step must be >= 0, got {step}")
        lr = decayed(step)
        if step < warmup_steps:
            lr *= (step + 1) / warmup_steps
        return lr

    schedule.kind = kind
    return schedule


def _check_values(kind: str, base_lr: float, min_lr: float, total_steps: int | None, warmup_steps: int,
                  step_size: int, gamma: float) -> None:
    """The values `kind` needs, each in its range; a ValueError naming the first that is not."""
    if base_lr < 0 or min_lr < 0:
        raise ValueError(f"learning rates must be >= 0, got base_lr={base_lr}, min_lr={min_lr}")
    if warmup_steps < 0:
        raise ValueError(f"warmup_steps must be >= 0, got {warmup_steps}")
    if kind == "step" and (step_size < 1 or gamma <= 0):
        raise ValueError(f"'step' schedule needs step_size >= 1 and gamma > 0, got {step_size}, {gamma}")
    if kind == "cosine" and (total_steps is None or total_steps < 1):
        raise ValueError(f"'cosine' schedule needs total_steps >= 1, got {total_steps}")
