"""A live run's pushes as its server took them, for an exact replay with real weights.

``simulate --replay RUN --train`` under the run's own sync model feeds the coordinator the recorded
pushes in the recorded order at the recorded times, so the policy decides what it decided live and
every gradient is computed on the version the live worker computed it on: the replay's ``model.h5``
equals the live one up to float summation order. :meth:`Recording.check` holds the replay to that:
each push must find the version it found live and have been computed on the version it was live,
or the replay is refused. Under another sync model, or another number of workers, the recorded order
would not fit, and the replay takes the recorded iteration times instead (``sim.workers.ReplayWorkers``).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..config import JobConfig, to_dict
from ..errors import UsageError
from .events import SimResult

#: Keys of ``[sync]`` that may differ without changing what the policy decides
_FREE_SYNC_KEYS = {"workers"}


@dataclass
class Recording:
    """The recorded pushes, in the server's order, with what each found and was computed on."""

    t0: float
    pushes: list[tuple[float, int]]
    worker: np.ndarray
    iteration: np.ndarray
    version_before: np.ndarray
    version_used: np.ndarray
    where: str
    #: the live run's largest message: with wait-free backprop, the row blocks its workers computed
    #: their weight gradients in (the blocks' GEMMs sum in their own order)
    chunk_bytes: int | None = None

    def check(self, result: SimResult) -> None:
        """Every push of the replay found the version and was computed on the version it was live (the
        recorded pushes past the replay's own limits were not replayed, and are not compared)."""
        for k, (w, i) in enumerate(zip(self.worker.tolist(), self.iteration.tolist(), strict=True)):
            if i >= len(result.before[w]):
                continue
            before, used = int(result.before[w][i]), int(result.used[w][i])
            if (before, used) != (self.version_before[k], self.version_used[k]):
                raise UsageError(
                    f"{self.where}: push {k} (worker {w}, iteration {i}) found version {before} computed on "
                    f"{used} in the replay, {self.version_before[k]} on {self.version_used[k]} live; the "
                    "recording cannot be paired")


def recorded_pushes(run_dir, job: JobConfig, workers: int) -> Recording | None:
    """The recording of `run_dir` when `job` with `workers` decides as the run did, else None.

    Raises
    ------
    UsageError
        When the run did not finish (no ``summary.json``) or its server trace lacks its pushes.
    """
    from ..trace.reader import TraceError, read_trace

    run_dir = Path(run_dir)
    where = f"simulate --train --replay {run_dir}"
    if not (run_dir / "summary.json").is_file():
        raise UsageError(f"{where}: the run did not finish (no summary.json): its last pushes are not recorded")
    try:
        server = read_trace(run_dir / "trace" / "rank-0000.h5")
        pushes, pulls = server.table("pushes"), server.table("pulls")
    except (TraceError, OSError, KeyError) as e:
        raise UsageError(f"{where}: the server's trace cannot be read ({e})") from None
    recorded_sync = dict(server.config.get("sync", {}))
    ours = to_dict(job)["sync"]
    same = all(recorded_sync.get(k) == v for k, v in ours.items() if k not in _FREE_SYNC_KEYS)
    if not same or len(np.unique(pulls["worker"])) != workers:
        return None
    order = np.arange(len(pushes))  # the server's own order of taking them
    return Recording(
        t0=float(pulls["t_reply"].min()) if len(pulls) else 0.0,
        pushes=list(zip(pushes["t"][order].tolist(), pushes["worker"][order].tolist(), strict=True)),
        worker=pushes["worker"].astype(np.int64), iteration=pushes["iteration"].astype(np.int64),
        version_before=pushes["version_before"].astype(np.int64),
        version_used=(pushes["version_before"] - pushes["staleness"]).astype(np.int64), where=where,
        chunk_bytes=server.attrs.get("chunk_bytes"))
