"""The wire protocol between the parameter server (rank 0) and the workers (ranks 1..N-1).

One place names every tag and lays out every message; both sides build their buffers from here.
Nothing in this module calls MPI, so the layout is tested without it.

A worker's iteration, as messages (DESIGN.md, "Parameters on the wire"):

- **push** (worker -> server): the gradient, one message per chunk of the ``ParamSpace`` gradient
  buffer (tag ``CHUNK_TAG0 + k``), then a header (``PUSH_TAG``) of :data:`PUSH_FIELDS`. The header
  completes the push; the server acts on a push only when every chunk and the header have arrived.
- **pull reply** (server -> worker): a header (``PULL_TAG``) of :data:`PULL_FIELDS`, then the weights,
  chunked like the gradient. A worker's next push implies its next pull request, so there is no
  separate request message.
- **keep-alive** (server -> worker, ``ALIVE_TAG``): while the sync model holds a worker's pull, the
  server tells it every quarter of ``runtime.stall_timeout_s`` that it still lives, so that a worker's
  own watchdog (no word from the server within the stall timeout) tells a long hold from a dead or
  stopped server. A worker keeps one receive of it posted from start-up to its stop reply.
- **statistics** (worker -> server, ``STATS_TAG``), once, after the reply that told the worker to stop:
  a small dict for the run's summary (the only pickled message; it is off the hot path). The server
  takes it whenever it arrives and waits for the missing ones at the end, polling, so that a worker
  that dies after its last push still ends the job instead of hanging it.

Chunks follow the tensors (last layer's tensors last), and a tensor larger than ``chunk_bytes`` is split,
so a layer's gradient can go out as soon as its backward is done (Poseidon's wait-free backpropagation).
Headers are float64 arrays: every integer field is exact below 2**53.
"""

from __future__ import annotations

from collections import namedtuple
from dataclasses import dataclass

import numpy as np

PUSH_TAG = 1
PULL_TAG = 2
CLOCK_TAG = 3  # the clock-offset ping-pong at start-up (runtime.comm)
STATS_TAG = 4
ALIVE_TAG = 5  # the server to a worker whose pull it holds: it still lives (no payload to read)
CHUNK_TAG0 = 100

#: push header: iteration (0-based index of this worker's iteration), the model version the gradient was
#: computed from, the minibatch loss, the injected straggler delay (s), epochs of its shard done, the
#: seconds of forward + backward, and the seconds the worker waited for the weights it used (the server
#: sums these three per worker, so that a checkpoint knows them)
PUSH_FIELDS = ("iteration", "version", "loss", "injected_delay_s", "epoch", "compute_s", "wait_s")
#: pull reply header: the model version of the weights that follow, 1 when the worker must stop, 1 when
#: the worker should flush its trace (the server has written a checkpoint: what a resumed run keeps of
#: the traces is what was flushed before it)
PULL_FIELDS = ("version", "stop", "flush")


def field_index(fields: tuple[str, ...]):
    """Each field's position in a header of `fields`, by name (``PUSH.loss``), so that no code
    depends on the order of the fields."""
    return namedtuple("FieldIndex", fields)(*range(len(fields)))


#: positions in a push header and a pull reply header: ``head[PUSH.iteration]``, ``head[PULL.stop]``
PUSH = field_index(PUSH_FIELDS)
PULL = field_index(PULL_FIELDS)


def header(fields: tuple[str, ...]) -> np.ndarray:
    """A zeroed header buffer for `fields`."""
    return np.zeros(len(fields), dtype=np.float64)


def pack(head: np.ndarray, fields: tuple[str, ...], **values: float) -> None:
    """Write every field of `fields` into the header buffer `head`, by name; a missing or unknown
    field is an error (ValueError), not a silently shifted or stale value."""
    if len(values) != len(fields) or not all(name in values for name in fields):
        raise ValueError(f"header fields {sorted(values)}, expected exactly {list(fields)}")
    head[:] = [values[name] for name in fields]


@dataclass(frozen=True)
class Chunk:
    """A contiguous piece of the flat parameter (or gradient) buffer: elements [start, stop)."""

    start: int
    stop: int
    tag: int

    @property
    def size(self) -> int:
        return self.stop - self.start


#: ``runtime.chunk_bytes = 0``: where every rank has a core, small chunks let the server stream a BSP
#: reply (the worker copies chunk k while the server updates chunk k+1); where ranks share cores nothing
#: runs alongside, and every extra message costs a wake-up of a sleeping rank, so fewer, larger ones
AUTO_CHUNK_BYTES = {"own core": 512 << 10, "shared cores": 4 << 20}


def chunk_bytes_for(configured: int, oversubscribed: bool) -> int:
    """The message size a run uses: ``runtime.chunk_bytes``, or when it is 0 the automatic choice for
    a job where some node is `oversubscribed` (the same on every rank, so both ends agree)."""
    if configured:
        return configured
    return AUTO_CHUNK_BYTES["shared cores" if oversubscribed else "own core"]


def plan_chunks(tensor_bounds: list[tuple[int, int]], itemsize: int, chunk_bytes: int,
                tag_ub: int = 32767) -> list[Chunk]:
    """Split the flat buffer into messages: one per tensor, big tensors in pieces of <= chunk_bytes.

    Parameters
    ----------
    tensor_bounds : list of (offset, size)
        The tensors of the ``ParamSpace``, in buffer order, in elements.
    itemsize : int
        Bytes per element (4 for float32).
    chunk_bytes : int
        Largest message in bytes (``runtime.chunk_bytes``).
    tag_ub : int
        The MPI implementation's largest tag (``MPI.TAG_UB``; the standard guarantees 32767).
    """
    per_chunk = max(1, chunk_bytes // itemsize)
    chunks: list[Chunk] = []
    for offset, size in tensor_bounds:
        for start in range(offset, offset + size, per_chunk):
            chunks.append(Chunk(start, min(start + per_chunk, offset + size), CHUNK_TAG0 + len(chunks)))
    if chunks and chunks[-1].tag > tag_ub:
        raise ValueError(f"{len(chunks)} messages per push exceed the MPI tag limit {tag_ub}; "
                         f"raise runtime.chunk_bytes (now {chunk_bytes})")
    return chunks


class ProtocolError(RuntimeError):
    """A message of unexpected size, tag or content (the run stops rather than hangs)."""
