"""How a run's parameters travel: messages, SFB layers and shards, the same on every rank.

Every rank computes the :class:`Layout` from the job and the model alone, so a worker, rank 0 and the
other servers agree on it without a message: the chunks of a push (``protocol.plan_chunks``), which
dense layers go as sufficient factors (``comm.hybrid``), and which server owns each chunk
(``runtime.servers``; ``protocol.plan_shards``).
"""

from __future__ import annotations

from dataclasses import dataclass

from mpi4py import MPI

from .. import build
from .hybrid import SFBLayer, sfb_layers, tensor_of_chunks
from .protocol import Chunk, Shard, owner_of_chunks, plan_chunks, plan_shards


@dataclass(frozen=True)
class Layout:
    """The messages and shards of a run.

    Attributes
    ----------
    chunks : list of Chunk
        The messages of a push (and of a reply), in buffer order.
    chunk_tensor : list of str
        The tensor of each chunk.
    chunk_bytes : int
        The largest message, in bytes.
    sfb : list of SFBLayer
        The dense layers whose weight gradient travels as sufficient factors.
    sfb_bsp : bool
        BSP with SFB layers: the workers step those layers themselves (``runtime.hybrid``).
    hybrid_plan : dict
        ``comm.hybrid``'s choice per tensor, for the summary.
    shards : list of Shard
        Each server's chunks and elements.
    owner : list of int
        The server rank of each chunk.
    """

    chunks: list[Chunk]
    chunk_tensor: list[str]
    chunk_bytes: int
    sfb: list[SFBLayer]
    sfb_bsp: bool
    hybrid_plan: dict
    shards: list[Shard]
    owner: list[int]

    def server_of_layer(self, layer: SFBLayer) -> int:
        """The server that owns an SFB layer's weight tensor (all its chunks are on one server)."""
        return self.owner[self.chunk_tensor.index(layer.name)]

    def describe(self) -> str:
        """The shard plan in one line, for the log: each server's elements and share of the bytes."""
        total = sum(s.size for s in self.shards)
        return "; ".join(f"rank {s.server}: elements [{s.lo}, {s.hi}) in {s.stop - s.first} messages, "
                         f"{100 * s.size / total:.1f} %" for s in self.shards)

    def as_attrs(self) -> dict:
        """The plan for the trace attributes and summary: per server, its element range."""
        return {"servers": len(self.shards), "shards": [[s.lo, s.hi] for s in self.shards],
                "chunk_bytes": self.chunk_bytes}


def make_layout(ctx, job, model) -> Layout:
    """The layout of `job` on `model`'s ParamSpace with this job's ranks (``ctx``)."""
    space = model.space
    total_bytes = space.size * space.data.itemsize
    chunk_bytes = ctx.chunk_bytes(job.runtime.chunk_bytes, total_bytes)
    chunks = plan_chunks([(t.offset, t.size) for t in space.tensors], space.data.itemsize, chunk_bytes,
                         ctx.comm.Get_attr(MPI.TAG_UB))
    names, plan = build.hybrid_plan(job, model, ctx.workers)
    sfb = sfb_layers(space, names)
    chunk_tensor = tensor_of_chunks(space, chunks)
    # an SFB layer's factors rebuild its whole weight tensor on one rank: keep its chunks together
    together = [[k for k, t in enumerate(chunk_tensor) if t == a.name] for a in sfb]
    try:
        shards = plan_shards(chunks, ctx.servers, together)
    except ValueError as e:
        from ..errors import UsageError

        raise UsageError(str(e)) from None
    return Layout(chunks=chunks, chunk_tensor=chunk_tensor, chunk_bytes=chunk_bytes, sfb=sfb,
                  sfb_bsp=bool(sfb) and job.sync.model == "bsp", hybrid_plan=plan, shards=shards,
                  owner=owner_of_chunks(shards))
