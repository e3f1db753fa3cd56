"""What every rank does around its role: its start under MPI, the launch environment it checks before
``MPI_Init``, termination requests, a dead peer named, fault injection, its trace file, and the abort
that takes the whole job down."""
