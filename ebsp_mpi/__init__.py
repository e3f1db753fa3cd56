"""ebsp-mpi: parameter-server training over MPI for studying synchronization under stragglers.

Rank 0 is a parameter server and the sync scheduler (ZipLine for ElasticBSP); with ``runtime.servers = k``
ranks 1..k-1 serve shards of the parameters, and ranks k..N-1 are the workers. docs/design.md says how
the pieces fit; the layout table of README.md names the subpackages and what each holds.
"""

__version__ = "0.1.0"
