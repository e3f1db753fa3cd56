"""Datasets, sharding and batching, on the host with NumPy (no MPI, no device code).

``load_dataset`` turns a dataset name into a ``Dataset`` of normalised float32
arrays; ``shard_indices`` and ``BatchStream`` decide which training samples
each worker draws in each iteration, identically in the MPI workers and in the
single-process oracle trainer.
"""

from .dataset import Dataset
from .errors import DatasetError
from .loader import DATASETS, load_dataset
from .sharding import BatchStream, shard_indices, worker_streams

__all__ = ["DATASETS", "BatchStream", "Dataset", "DatasetError", "load_dataset", "shard_indices",
           "worker_streams"]
