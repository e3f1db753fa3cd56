"""Sync policies by the name a job file uses (``sync.model``)."""

from __future__ import annotations

from collections.abc import Callable

from ..config import SyncConfig
from .asp import ASP
from .base import SyncPolicy
from .bsp import BSP
from .dssp import DSSP
from .elastic import ElasticBSP
from .psp import PSP
from .ssp import SSP

#: model name -> how to build it from the ``[sync]`` section, the number of workers and the job's seed;
#: each takes only its own keys (and its constructor checks them)
_BUILDERS: dict[str, Callable[[SyncConfig, int, int], SyncPolicy]] = {
    "bsp": lambda s, n, seed: BSP(n),
    "asp": lambda s, n, seed: ASP(n),
    "ssp": lambda s, n, seed: SSP(n, staleness=s.staleness),
    "dssp": lambda s, n, seed: DSSP(n, staleness=s.staleness, dssp_range=s.dssp_range),
    "elasticbsp": lambda s, n, seed: ElasticBSP(n, lookahead=s.lookahead, penalty=s.penalty, predictor=s.predictor,
                                                ema_alpha=s.ema_alpha, zipline_z=s.zipline_z,
                                                overdue=s.overdue, replan=s.replan),
    "psp": lambda s, n, seed: PSP(n, sample=s.sample, staleness=s.staleness, seed=seed),
}

#: Every model name ``make_policy`` accepts, in the order docs/design.md lists them (``sync.model``'s choices).
POLICIES = tuple(_BUILDERS)

#: model name -> its class, for what a model is without building one (:func:`round_based`)
_CLASSES: dict[str, type[SyncPolicy]] = {"bsp": BSP, "asp": ASP, "ssp": SSP, "dssp": DSSP, "elasticbsp": ElasticBSP,
                                         "psp": PSP}


def round_based(sync: SyncConfig) -> bool:
    """Whether the job's model applies rounds (BSP: the mean of a round's pushes as one step) rather than
    each push on its own, as its policy says (``SyncPolicy.round_based``): the one place that is decided,
    for the ranks and layouts that need to know without running the policy."""
    try:
        return _CLASSES[sync.model].round_based
    except KeyError:
        raise ValueError(f"unknown sync model {sync.model!r}; expected one of {', '.join(POLICIES)}") from None


def make_policy(sync: SyncConfig, workers: int, seed: int = 0) -> SyncPolicy:
    """Build the sync policy that the job's ``[sync]`` section names, for ``workers`` workers.

    Parameters
    ----------
    sync : SyncConfig
        The job's ``[sync]`` section: ``model`` (one of :data:`POLICIES`), and the keys of that model
        (``staleness`` for SSP, DSSP and PSP, ``dssp_range`` for DSSP, ``lookahead``, ``penalty``,
        ``predictor``, ``ema_alpha``, ``zipline_z``, ``overdue`` and ``replan`` for ElasticBSP, ``sample``
        for PSP); the other keys are not read.
    workers : int
        Number of workers (>= 1).
    seed : int
        The job's seed (PSP draws its samples from it).

    Raises
    ------
    ValueError
        For an unknown model (the message lists :data:`POLICIES`) or a parameter out of range.
    """
    try:
        build = _BUILDERS[sync.model]
    except KeyError:
        raise ValueError(f"unknown sync model {sync.model!r}; expected one of {', '.join(POLICIES)}") from None
    return build(sync, workers, seed)
