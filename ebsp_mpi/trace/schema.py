"""The HDF5 trace schema: one structured dtype per event table.

Every rank writes one file (``DIR/trace/rank-NNNN.h5``, see :func:`ebsp_mpi.trace.writer.trace_path`).
A worker's file holds ``iterations``; the server's (rank 0) holds ``pushes``, ``pulls``, ``evals``,
``barriers``, ``barrier_members`` and ``zipline``. With ``runtime.servers = k > 1`` the other servers'
files (ranks 1..k-1) hold no table, only attributes (their ``shards`` and ``bytes``): rank 0 decides
everything and they carry out its orders. Each table is a chunked, resizable, one-dimensional
dataset of the dtype below; a table that never received a row is absent from the file.

All times (``t*`` fields) are seconds since the run's start on rank 0's clock: a worker converts its
local clock with the offset it measured at start-up (root attribute ``clock_offset_s``). Versions
count optimizer steps applied to the global model; iterations count a worker's pushes.

Root attributes (docs/design.md, "Run outputs"): ``run_id``, ``rank``, ``role`` (``"server"`` or
``"worker"``), ``world_size``, ``host``, ``backend``, ``device``, ``mpi_library``,
``package_version``, ``config`` (the resolved job config, stored as the JSON string ``config_json``)
and ``clock_offset_s``. The writer adds ``trace_schema_version``.
"""

from __future__ import annotations

import numpy as np

#: Bumped when a table's fields change meaning or layout; stored as a root attribute.
SCHEMA_VERSION = 1

#: Names of the root attributes every rank is expected to write (documentation; not enforced).
ROOT_ATTRS = (
    "run_id",
    "rank",
    "role",
    "world_size",
    "host",
    "backend",
    "device",
    "mpi_library",
    "package_version",
    "config",
    "clock_offset_s",
)

#: One row per iteration of a worker (worker files).
ITERATIONS = np.dtype(
    [
        ("iteration", "i8"),  # 0-based count of this worker's iterations
        ("t_start", "f8"),  # weights in hand, compute starts
        ("t_compute_end", "f8"),  # forward + backward + injected delay done
        ("t_push", "f8"),  # gradient push posted
        ("t_end", "f8"),  # next weights received
        ("wait_s", "f8"),  # seconds blocked on the pull: t_end - t_push
        ("version", "i8"),  # global model version the iteration started from
        ("loss", "f4"),  # training loss of the iteration's batch
        ("injected_delay_s", "f8"),  # seconds slept to emulate a straggler
        ("epoch", "f8"),  # epochs of the worker's shard done (fractional)
    ]
)

#: One row per gradient push received by the server.
PUSHES = np.dtype(
    [
        ("worker", "i4"),  # worker index k (MPI rank k + runtime.servers), as in the sync policies
        ("iteration", "i8"),  # the worker's 0-based iteration (as in its ``iterations`` table)
        ("t", "f8"),  # arrival time
        ("version_before", "i8"),  # global version when the push arrived
        ("staleness", "i8"),  # version_before - version the gradient was computed from
        ("rejected", "u1"),  # 1: NaN/Inf in the gradient, not applied
    ]
)

#: One row per pull answered by the server.
PULLS = np.dtype(
    [
        ("worker", "i4"),  # worker index k (MPI rank k + runtime.servers)
        ("t_request", "f8"),  # pull request arrived
        ("t_reply", "f8"),  # weights sent (later than t_request when the sync model held it)
        ("version", "i8"),  # global version sent
    ]
)

#: One row per evaluation on held-out data.
EVALS = np.dtype(
    [
        ("t", "f8"),  # evaluation started
        ("version", "i8"),  # global version evaluated
        ("test_loss", "f8"),
        ("test_acc", "f8"),  # fraction in [0, 1]
        ("seconds", "f8"),  # evaluation duration
    ]
)

#: One row per ElasticBSP barrier (ICDM 2019, Sec. III): decided by ZipLine, released when all arrive.
BARRIERS = np.dtype(
    [
        ("barrier", "i8"),  # 0-based barrier number
        ("t_decided", "f8"),  # ZipLine chose the barrier
        ("t_released", "f8"),  # last worker arrived, all pulls answered
        ("predicted_time", "f8"),  # predicted barrier time: max of the chosen push times
        ("predicted_spread", "f8"),  # predicted max - min of the chosen push times
        ("observed_spread", "f8"),  # max - min of the actual arrival times
        ("z", "f8"),  # robust ZipLine's z (0: the paper's ZipLine)
        ("predicted_interval_spread", "f8"),  # max(M + z sigma) - min(M - z sigma) of the chosen entries
        ("sigma_mean", "f8"),  # mean prediction error scale sigma of the chosen entries (seconds)
    ]
)

#: One row per (barrier, worker): the lookahead column ZipLine chose and when the worker got there.
BARRIER_MEMBERS = np.dtype(
    [
        ("barrier", "i8"),
        ("worker", "i4"),  # worker index k (MPI rank k + runtime.servers)
        ("r", "i8"),  # the worker's barrier is its r-th next push (1-based, 1 <= r <= R)
        ("predicted_t", "f8"),  # predicted time of that push
        ("arrival_t", "f8"),  # actual time of that push
        ("sigma", "f8"),  # learned error scale of that prediction (seconds; 0 before any error was seen)
    ]
)

#: One row per ZipLine call (Machine Learning 2021, ZipLineOptBS).
ZIPLINE = np.dtype(
    [
        ("t", "f8"),  # call time
        ("n", "i4"),  # workers (rows of the prediction matrix)
        ("R", "i4"),  # lookahead (columns)
        ("seconds", "f8"),  # duration of the call
    ]
)

#: Every table by its dataset name.
TABLES: dict[str, np.dtype] = {
    "iterations": ITERATIONS,
    "pushes": PUSHES,
    "pulls": PULLS,
    "evals": EVALS,
    "barriers": BARRIERS,
    "barrier_members": BARRIER_MEMBERS,
    "zipline": ZIPLINE,
}

#: A simulation of many workers (more than ``ebsp_mpi.sim.run.WORKER_FILES_MAX``) writes their
#: ``iterations`` into this one file of the trace directory instead of a file per rank, as the table
#: ``worker_iterations``: the rows of :data:`ITERATIONS` with the worker index first, by worker.
#: :func:`ebsp_mpi.trace.reader.read_run` gives it back as one trace per worker rank.
WORKERS_FILE = "workers.h5"
WORKER_ITERATIONS = np.dtype([("worker", "i4"), *((name, ITERATIONS[name]) for name in ITERATIONS.names)])

#: Tables each role writes.
WORKER_TABLES = ("iterations",)
SERVER_TABLES = ("pushes", "pulls", "evals", "barriers", "barrier_members", "zipline")
