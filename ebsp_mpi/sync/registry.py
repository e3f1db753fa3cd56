"""Sync policies by the name a job file uses (``sync.model``)."""

from __future__ import annotations

from collections.abc import Callable

from ..config import SyncConfig
from .asp import ASP
from .base import SyncPolicy
from .bsp import BSP
from .dssp import DSSP
from .elastic import ElasticBSP
from .ssp import SSP

#: model name -> how to build it from the ``[sync]`` section and the number of workers; each takes only
#: its own keys (and its constructor checks them)
_BUILDERS: dict[str, Callable[[SyncConfig, int], SyncPolicy]] = {
    "bsp": lambda s, n: BSP(n),
    "asp": lambda s, n: ASP(n),
    "ssp": lambda s, n: SSP(n, staleness=s.staleness),
    "dssp": lambda s, n: DSSP(n, staleness=s.staleness, dssp_range=s.dssp_range),
    "elasticbsp": lambda s, n: ElasticBSP(n, lookahead=s.lookahead, penalty=s.penalty, predictor=s.predictor,
                                          ema_alpha=s.ema_alpha),
}

#: Every model name ``make_policy`` accepts, in the order DESIGN.md lists them (``sync.model``'s choices).
POLICIES = tuple(_BUILDERS)


def make_policy(sync: SyncConfig, workers: int) -> SyncPolicy:
    """Build the sync policy that the job's ``[sync]`` section names, for ``workers`` workers.

    Parameters
    ----------
    sync : SyncConfig
        The job's ``[sync]`` section: ``model`` (one of :data:`POLICIES`), and the keys of that model
        (``staleness`` for SSP and DSSP, ``dssp_range`` for DSSP, ``lookahead``, ``penalty``,
        ``predictor`` and ``ema_alpha`` for ElasticBSP); the other keys are not read.
    workers : int
        Number of workers (>= 1).

    Raises
    ------
    ValueError
        For an unknown model (the message lists :data:`POLICIES`) or a parameter out of range.
    """
    try:
        build = _BUILDERS[sync.model]
    except KeyError:
        raise ValueError(f"unknown sync model {sync.model!r}; expected one of {', '.join(POLICIES)}") from None
    return build(sync, workers)
