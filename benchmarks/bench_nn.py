"""Our Dense/Conv2D/MaxPool2D and SGD against PyTorch on the CPU: ``python benchmarks/bench_nn.py``.

See :mod:`ebsp_mpi.bench.nn` for what is timed; ``--help`` lists the options.
"""
from ebsp_mpi.runtime.env import cap_blas_threads

cap_blas_threads()  # one thread for both peers: before NumPy (and PyTorch) load their BLAS

from ebsp_mpi.bench.nn import main  # noqa: E402

raise SystemExit(main())
