"""Benchmarks behind ``python -m ebsp_mpi bench KIND``: one module per kind, each with ``main(argv, records)``.

:data:`KINDS` names them without importing them, so the command line starts without NumPy or MPI.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Kind:
    """A benchmark: its module (with ``main(argv=None, records=None) -> int``), the MPI ranks it needs
    (1: none, runs without mpiexec) and a one-line description."""

    module: str
    ranks: int
    help: str


KINDS = {
    "mpi": Kind("ebsp_mpi.bench.mpi", 2, "raw MPI point-to-point latency and bandwidth, 4 KiB - 64 MiB"),
    "ps": Kind("ebsp_mpi.bench.ps", 2, "push + pull round trip through the server against raw MPI; "
                                       "the server's update against a NumPy axpy"),
    "overhead": Kind("ebsp_mpi.bench.overhead", 2, "seconds per iteration of BSP (1 worker + server) "
                                                   "against the single-process trainer"),
    "hybcomm": Kind("ebsp_mpi.bench.hybcomm", 3, "dense layers under BSP with comm.hybrid = ps, sfb, auto: "
                                                 "bytes per iteration against the cost model, seconds "
                                                 "per iteration, the PS/SFB crossover"),
    "train": Kind("ebsp_mpi.bench.train", 1, "end-to-end samples per second of BSP and ASP runs against "
                                             "the single-process trainer and PyTorch DDP (launches mpiexec)"),
    "cluster": Kind("ebsp_mpi.bench.cluster", 1, "BSP across the nodes of a virtual cluster (links shaped "
                                                 "with tc) against the links' bound and PyTorch DDP (as root)"),
    "nn": Kind("ebsp_mpi.bench.nn", 1, "Dense, Conv2D, MaxPool2D and SGD against PyTorch on the CPU"),
    "zipline": Kind("ebsp_mpi.bench.zipline", 1, "ZipLine against a heapq scan and brute force"),
    "simulate": Kind("ebsp_mpi.bench.simulate", 1, "the simulator's pushes per second per sync policy "
                                                   "against a bare heapq event loop"),
}
