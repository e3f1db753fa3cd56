"""The simulator benchmarks' workload, shared by ``bench simulate`` and its ``--train`` form
(:mod:`ebsp_mpi.bench.emulate`): the policies timed, the iteration times, one timed simulation."""

from __future__ import annotations

import time

import numpy as np

from ebsp_mpi.bench.report import record
from ebsp_mpi.config import SyncConfig
from ebsp_mpi.sim.events import simulate
from ebsp_mpi.sync.registry import make_policy

#: (label, [sync] section) of each policy timed
POLICIES = (
    ("bsp", SyncConfig(model="bsp")),
    ("asp", SyncConfig(model="asp")),
    ("ssp(s=3)", SyncConfig(model="ssp", staleness=3)),
    ("dssp(s=3,r=3)", SyncConfig(model="dssp", staleness=3, dssp_range=3)),
    ("elasticbsp(R=15)", SyncConfig(model="elasticbsp", lookahead=15)),
    ("psp(β=2,s=3)", SyncConfig(model="psp", sample=2, staleness=3)),
)


def chosen(wanted: list[str]) -> list[tuple[str, SyncConfig]]:
    """The policies of :data:`POLICIES` whose model is in `wanted`, in its order."""
    return [(label, sync) for label, sync in POLICIES if sync.model in wanted]


def keep(records: list | None, label: str, seconds: float, reference: str, reference_seconds: float) -> None:
    """With `records`, append one policy's seconds against its reference's (:mod:`ebsp_mpi.bench.report`)."""
    if records is not None:
        records.append(record("simulate", label, seconds, "s", reference, reference_seconds))


def print_header(header: str) -> None:
    """A table's header line and its rule."""
    print(header)
    print("-" * len(header))


def intervals(n: int, seed: int, columns: int = 256) -> np.ndarray:
    """(n, columns) seconds: a log-uniform spread of speeds over 4x times log-normal jitter."""
    rng = np.random.default_rng(seed)
    speed = np.exp(rng.uniform(0.0, np.log(4.0), n)) * 0.01
    return speed[:, None] * rng.lognormal(0.0, 0.2, (n, columns))


def timed_simulation(sync: SyncConfig, workers: int, table: np.ndarray, iterations: int, seed: int,
                     trainer=None):
    """``(result, seconds)`` of one policy's simulation of `workers` x `iterations` pushes over `table`
    (with `trainer`: real weights, its set-up already done)."""
    policy = make_policy(sync, workers, seed=seed)
    started = time.perf_counter()
    result = simulate(policy, table, iterations, keep_releases=False, trainer=trainer)
    return result, time.perf_counter() - started
