"""ebsp-mpi: parameter-server training over MPI for studying synchronization under stragglers.

Rank 0 is the parameter server and the sync scheduler (ZipLine for ElasticBSP); ranks 1..N-1 are
workers. See DESIGN in the README for the layers of the package.
"""

__version__ = "0.1.0"
