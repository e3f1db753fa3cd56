"""The subcommands ``profile`` and ``plan``: OSDP's planning of a job, and the authors' problem.

Unlike :mod:`ebsp_mpi.plan`, which is pure (cost models and exact searches: no device, no MPI, no
job), these build the job's model, time it on the worker's device and read benchmark results, so they
import ``build``, ``backend`` and ``bench``. They sit beside the commands of ``cli.py``, not inside
the planning they call:

- :mod:`.profile` — ``profile JOB``: per-layer times and a step's memory on the device;
- :mod:`.plan` — ``plan JOB --memory-limit SIZE``: OSDP's plan for the job, written for ``osdp.plan``;
- :mod:`.authors` — ``plan --osdp-profile FILE``: the authors' own problem on their profile, apart
  from planning a job.

Each imports only the standard library until it runs, so the CLI starts without NumPy.
"""

from __future__ import annotations


def add_parsers(subparsers) -> None:
    """Register ``profile`` and ``plan`` on the CLI's subparsers (``ebsp_mpi.cli``)."""
    from . import plan, profile

    profile.add_parser(subparsers)
    plan.add_parser(subparsers)
