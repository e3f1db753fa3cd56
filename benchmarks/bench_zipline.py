import os; os.environ.setdefault("OMP_NUM_THREADS", "1")  # before numpy is imported
from ebsp_mpi.bench.zipline import main
raise SystemExit(main())
