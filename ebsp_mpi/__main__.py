"""``python -m ebsp_mpi ...``: see :mod:`ebsp_mpi.cli`."""

from ebsp_mpi.runtime.env import prepare_rank_env

# before NumPy loads its BLAS and before MPI starts: several ranks on one node must not each start a
# thread per core, and MPICH reads its settings when it starts
prepare_rank_env()

from ebsp_mpi.cli import main  # noqa: E402

raise SystemExit(main())
