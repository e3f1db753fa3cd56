"""``python -m ebsp_mpi ...``: see :mod:`ebsp_mpi.cli`."""

from ebsp_mpi.cli import main

raise SystemExit(main())
