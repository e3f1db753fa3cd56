"""ebsp-mpi: parameter-server training over MPI for studying synchronization under stragglers.

Rank 0 is the parameter server and the sync scheduler (ZipLine for ElasticBSP); ranks 1..N-1 are
workers. The layout table of README.md names the subpackages and what each holds.
"""

__version__ = "0.1.0"
