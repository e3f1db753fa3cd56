"""Benchmark: raw MPI point-to-point latency and bandwidth between rank 0 and rank 1.

``mpiexec -n 2 python -m ebsp_mpi bench mpi``. For each message size (default 4 KiB to 64 MiB in
steps of 4x), rank 0 sends a preallocated byte buffer to rank 1 with a blocking ``Send`` and rank 1
sends it back (ping-pong, uppercase calls, no pickling); the one-way time is half the median round
trip over ``--reps`` after ``--warmup``, and the bandwidth is the size over the one-way time. The
reference is the local memory copy of the same bytes on rank 0 (``numpy.copyto``, median of as many
repetitions): on one node MPI moves messages through shared memory, so a copy is its ceiling. Further
ranks, if any, wait in a sleeping barrier.

A ping-pong sends the same buffer again and again, from the cores' caches. Messages of
:data:`COLD_FROM` bytes and more are also sent *cold*: each round trip takes the next of as many
buffers as fill :data:`COLD_POOL` bytes, so that every message starts in memory no cache holds, as an
OSDP fetch does (each unit from another place of the server's parameters into another place of the
worker's buffer). ``cold bandwidth`` records that, against the cached one; OSDP's planner takes its
bandwidth from them (``plan.osdp_files.network_from_bench``).
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from .ranks import abort_on_failure, idle_barrier, require_ranks, subgroup, world
from .report import human, median_seconds, parse_sizes, record, size_label
from ..safe_text import integer

SIZES = "4K,16K,64K,256K,1M,4M,16M,64M"
PING_TAG = 11
COLD_FROM = 256 << 10  # the smallest message also sent cold
COLD_POOL = 64 << 20  # bytes of buffers a cold ping-pong cycles through, on each rank (beyond the caches)


def ping_pong(comm, bufs: list[np.ndarray], reps: int, warmup: int) -> float:
    """Median round-trip seconds between ranks 0 and 1 (rank 0's figure; 0.0 on rank 1), round trip
    i sending ``bufs[i % len(bufs)]``."""
    rank = comm.Get_rank()
    times = []
    for i in range(warmup + reps):
        buf = bufs[i % len(bufs)]
        t = time.perf_counter()
        if rank == 0:
            comm.Send(buf, dest=1, tag=PING_TAG)
            comm.Recv(buf, source=1, tag=PING_TAG)
        else:
            comm.Recv(buf, source=0, tag=PING_TAG)
            comm.Send(buf, dest=0, tag=PING_TAG)
        if i >= warmup:
            times.append(time.perf_counter() - t)
    return float(np.median(times)) if rank == 0 else 0.0


def measure(comm, sizes: list[int], reps: int, warmup: int) -> list[dict]:
    """Ranks 0 and 1 ping-pong every size; rank 0 returns the records (the other ranks an empty list)."""
    records: list[dict] = []
    pair = subgroup(comm, 2)
    if pair is None:  # ranks beyond the pair wait, asleep
        idle_barrier(comm)
        return records
    rank = pair.Get_rank()
    for nbytes in sizes:
        buf = np.ones(nbytes, dtype=np.uint8)
        # large messages take long: fewer repetitions keep the run short without losing the median
        n = max(5, min(reps, int(reps * (4 << 20) / nbytes))) if nbytes > 4 << 20 else reps
        rtt = ping_pong(pair, [buf], n, warmup)
        cold = None
        if nbytes >= COLD_FROM:
            pool = [np.ones(nbytes, dtype=np.uint8) for _ in range(max(2, -(-COLD_POOL // nbytes)))]
            cold = ping_pong(pair, pool, max(n, len(pool)), warmup)
        if rank == 0:
            dst = np.empty_like(buf)
            copy_s = median_seconds(lambda dst=dst, buf=buf: np.copyto(dst, buf), n, warmup=max(1, warmup))
            one_way = rtt / 2
            label = size_label(nbytes)
            records.append(record("mpi", f"bandwidth {label}", nbytes / one_way, "B/s",
                                  "memory copy", nbytes / copy_s))
            records.append(record("mpi", f"latency {label}", one_way, "s", "memory copy", copy_s))
            if cold is not None:
                records.append(record("mpi", f"cold bandwidth {label}", nbytes / (cold / 2), "B/s",
                                      "from cache", nbytes / one_way))
        pair.Barrier()  # rank 1 waits here while rank 0 copies
    pair.Free()
    idle_barrier(comm)
    return records


def print_sizes(found: list[dict]) -> None:
    """One line per message size: latency and bandwidth beside the memory copy's, and the bandwidth
    of cold messages."""
    head = (f"{'size':>8} | {'one-way':>10} {'copy':>10} | {'bandwidth':>11} {'copy':>11} | {'ratio':>6} | "
            f"{'cold':>11}")
    print(head)
    print("-" * len(head))
    cases = {r["case"]: r for r in found}
    for bandwidth in (r for r in found if r["case"].startswith("bandwidth ")):
        size = bandwidth["case"].removeprefix("bandwidth ")
        latency, cold = cases[f"latency {size}"], cases.get(f"cold bandwidth {size}")
        print(f"{size:>8} | {human(latency['figure'], 's'):>10} {human(latency['reference_figure'], 's'):>10} | "
              f"{human(bandwidth['figure'], 'B/s'):>11} {human(bandwidth['reference_figure'], 'B/s'):>11} | "
              f"{bandwidth['ratio']:6.3f} | {human(cold['figure'], 'B/s') if cold else '':>11}")
    print()


def main(argv=None, records: list | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m ebsp_mpi bench mpi", description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default=SIZES, help=f"message sizes in bytes, K/M suffixes (default {SIZES})")
    parser.add_argument("--reps", type=integer, default=30, help="timed round trips per size (median)")
    parser.add_argument("--warmup", type=integer, default=3, help="untimed round trips first")
    args = parser.parse_args(argv)
    require_ranks("mpi", 2)
    sizes = parse_sizes(args.sizes)
    comm = world()
    with abort_on_failure():
        found = measure(comm, sizes, args.reps, args.warmup)
    if comm.Get_rank() == 0:
        from mpi4py import MPI

        library = " ".join(MPI.Get_library_version().split("\n")[0].split())
        print(f"raw MPI ping-pong, rank 0 <-> rank 1 ({library}, {comm.Get_size()} ranks); one-way time = half "
              f"the median of {args.reps} round trips; reference: numpy.copyto of the same bytes on rank 0")
        print_sizes(found)
        if records is not None:
            records += found
    return 0
