"""Shared test set-up.

Under ``mpiexec -n 3 python -m pytest --only-mpi`` every rank is a pytest process: cap BLAS threads
before NumPy loads, as the launcher does for training runs.
"""

from ebsp_mpi.runtime.env import limit_threads_under_mpi

limit_threads_under_mpi()
