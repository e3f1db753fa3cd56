"""The single-process reference trainer's former name, kept while a benchmark still imports it: the
trainer is :mod:`ebsp_mpi.reference`."""

from .reference import train  # noqa: F401
