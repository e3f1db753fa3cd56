"""ZipLine against a heapq scan and brute force: ``python benchmarks/bench_zipline.py``.

See :mod:`ebsp_mpi.bench.zipline` for what is timed; ``--help`` lists the options.
"""
from ebsp_mpi.runtime.env import cap_blas_threads

cap_blas_threads()  # one thread, for comparable figures: before NumPy loads its BLAS

from ebsp_mpi.bench.zipline import main  # noqa: E402

raise SystemExit(main())
