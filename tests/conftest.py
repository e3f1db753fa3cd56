"""Shared test set-up.

Under ``mpiexec -n 3 python -m pytest --only-mpi`` every rank is a pytest process: cap BLAS threads
before NumPy loads, as the launcher does for training runs.
"""

import os

from ebsp_mpi.runtime.env import limit_threads_under_mpi

limit_threads_under_mpi()

# The suite starts a few hundred Python processes (each rank of each end-to-end run). Where the
# environment disables bytecode caching, each would compile the package's sources again (about 0.4 s
# of CPU a process); let them cache it in __pycache__ as Python does by default.
os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
