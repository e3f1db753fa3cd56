"""Sync policies by the name a job file uses (``sync.model``)."""

from __future__ import annotations

from .asp import ASP
from .base import SyncPolicy
from .bsp import BSP
from .dssp import DSSP
from .ssp import SSP

#: Every model name ``make_policy`` accepts, in the order DESIGN.md lists them.
POLICIES = ("bsp", "asp", "ssp", "dssp", "elasticbsp")


def make_policy(
    name: str,
    workers: int,
    *,
    staleness: int = 3,
    dssp_range: int = 3,
    lookahead: int = 15,
    penalty: float = 0.0,
    predictor: str = "last",
    ema_alpha: float = 0.5,
) -> SyncPolicy:
    """Build the sync policy ``name`` for ``workers`` workers.

    Only the parameters of the named model are used (and checked by its constructor); the others are
    ignored, so a job's whole ``[sync]`` table can be passed through.

    Parameters
    ----------
    name : str
        One of :data:`POLICIES`.
    workers : int
        Number of workers (>= 1).
    staleness : int
        SSP and DSSP: the staleness bound s (iterations, >= 0).
    dssp_range : int
        DSSP: r, the threshold moves in [s, s + r] (iterations, >= 0).
    lookahead : int
        ElasticBSP: R, predicted pushes per worker that ZipLine chooses from.
    penalty : float
        ElasticBSP: lambda, weight of the superstep length against the spread (per second).
    predictor : str
        ElasticBSP: push-time predictor, ``"last"`` or ``"ema"``.
    ema_alpha : float
        ElasticBSP: smoothing factor of the ``"ema"`` predictor.

    Returns
    -------
    SyncPolicy

    Raises
    ------
    ValueError
        For an unknown ``name`` (the message lists :data:`POLICIES`) or a parameter out of range.
    """
    if name == "bsp":
        return BSP(workers)
    if name == "asp":
        return ASP(workers)
    if name == "ssp":
        return SSP(workers, staleness=staleness)
    if name == "dssp":
        return DSSP(workers, staleness=staleness, dssp_range=dssp_range)
    if name == "elasticbsp":
        # Imported here so the rest of the registry works while elastic.py is developed separately.
        from .elastic import ElasticBSP

        return ElasticBSP(
            workers, lookahead=lookahead, penalty=penalty, predictor=predictor, ema_alpha=ema_alpha
        )
    raise ValueError(f"unknown sync model {name!r}; expected one of {', '.join(POLICIES)}")
