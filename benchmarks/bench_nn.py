"""Our Dense/Conv2D/MaxPool2D and SGD against PyTorch on the CPU: ``python benchmarks/bench_nn.py``.

See :mod:`ebsp_mpi.bench.nn` for what is timed; ``--help`` lists the options.
"""
import os

for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(var, "1")   # before numpy loads its BLAS

from ebsp_mpi.bench.nn import main

raise SystemExit(main())
