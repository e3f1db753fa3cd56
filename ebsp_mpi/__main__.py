"""``python -m ebsp_mpi ...``: see :mod:`ebsp_mpi.cli`."""

from ebsp_mpi.runtime.env import limit_threads_under_mpi

# before NumPy loads its BLAS: several ranks on one node must not each start a thread per core
limit_threads_under_mpi()

from ebsp_mpi.cli import main  # noqa: E402

raise SystemExit(main())
