"""How a run's parameters travel: messages, SFB layers and shards, the same on every rank.

Every rank computes the :class:`Layout` from the job and the model alone, so a worker, rank 0 and the
other servers agree on it without a message: the chunks of a push (``protocol.plan_chunks``), which
dense layers go as sufficient factors (``comm.hybrid``), and which server owns each chunk
(``runtime.servers``; ``protocol.plan_shards``), and with an OSDP plan (``osdp.plan``) which units the
workers fetch on demand: their messages break where a unit starts or stops, so that an on-demand
unit's gradient goes as whole messages of its own.
"""

from __future__ import annotations

import functools
import itertools
from dataclasses import dataclass

from mpi4py import MPI

from ... import build
from ...plan.osdp_schedule import Schedule, make_schedule
from ...sync.registry import round_based
from .hybrid import SFBLayer, parts_of_chunks, sfb_layers
from .protocol import COALESCE_BYTES, Chunk, Shard, coalesce_chunks, owner_of_chunks, plan_chunks, plan_shards


@dataclass(frozen=True)
class Layout:
    """The messages and shards of a run.

    Attributes
    ----------
    chunks : list of Chunk
        The messages of a push (and of a reply), in buffer order.
    chunk_parts : tuple of tuple of (str, int)
        Per chunk, ``(tensor, elements)`` of each tensor it holds part of, in buffer order: one tensor,
        or several for a chunk that joins small ones (:meth:`parts`, :attr:`chunk_tensor`).
    chunk_bytes : int
        The largest message, in bytes.
    sfb : list of SFBLayer
        The dense layers whose weight gradient travels as sufficient factors.
    sfb_bsp : bool
        BSP with SFB layers: the workers step those layers themselves (``transport.hybrid``).
    hybrid_plan : dict
        ``comm.hybrid``'s choice per tensor, for the summary.
    shards : list of Shard
        Each server's chunks and elements.
    owner : list of int
        The server rank of each chunk.
    schedule : Schedule or None
        The OSDP plan as the workers run it; None when every layer is resident.
    fetched : list of bool
        Per chunk: it belongs to an on-demand unit (no pull reply carries it; its gradient is pushed
        from the worker's fetch buffer).
    unit_chunks : list of list of (int, int)
        Per unit of the schedule: its chunks, each with its element offset within the unit, in unit
        order (:meth:`unit_pieces` groups them by server).
    """

    chunks: list[Chunk]
    chunk_parts: tuple[tuple[tuple[str, int], ...], ...]
    chunk_bytes: int
    sfb: list[SFBLayer]
    sfb_bsp: bool
    hybrid_plan: dict
    shards: list[Shard]
    owner: list[int]
    schedule: Schedule | None = None
    fetched: tuple[bool, ...] = ()
    unit_chunks: tuple[tuple[tuple[int, int], ...], ...] = ()

    def parts(self, k: int) -> tuple[tuple[str, int], ...]:
        """``(tensor, elements)`` of each tensor chunk `k` holds: what the byte counters charge."""
        return self.chunk_parts[k]

    @functools.cached_property
    def chunk_tensor(self) -> list[str]:
        """The tensor each chunk starts in (the first of a chunk that joins small tensors)."""
        return [parts[0][0] for parts in self.chunk_parts]

    def server_of_layer(self, layer: SFBLayer) -> int:
        """The server that owns an SFB layer's weight tensor (all its chunks are on one server)."""
        return self.owner[self.chunk_tensor.index(layer.name)]

    def unit_pieces(self, u: int) -> list[tuple[int, int, list[int]]]:
        """Unit `u` by server: ``(server rank, element offset in the unit, its chunks)``, in unit order.

        A shard is one run of the flat buffer, so what one server holds of a unit is one run of the
        unit too (of a Conv2D slice, whose channels' W and b are two runs, a server can hold the end of
        the first and the start of the second, which the unit holds back to back): one message each.
        """
        pieces: list[tuple[int, int, list[int]]] = []
        for k, offset in self.unit_chunks[u]:
            server = self.owner[k]
            if pieces and pieces[-1][0] == server:
                pieces[-1][2].append(k)
            else:
                if any(p[0] == server for p in pieces):  # the argument above, checked
                    raise ValueError(f"unit {u}: server {server} holds two runs of it apart")
                pieces.append((server, offset, [k]))
        return pieces

    def describe(self) -> str:
        """The shard plan in one line, for the log: each server's elements and share of the bytes."""
        total = sum(s.size for s in self.shards)
        return "; ".join(f"rank {s.server}: elements [{s.lo}, {s.hi}) in {s.stop - s.first} messages, "
                         f"{100 * s.size / total:.1f} %" for s in self.shards)

    def as_attrs(self) -> dict:
        """The plan for the trace attributes and summary: per server, its element range."""
        return {"servers": len(self.shards), "shards": [[s.lo, s.hi] for s in self.shards],
                "chunk_bytes": self.chunk_bytes}


def tag_upper_bound(comm) -> int:
    """The largest message tag on `comm`. The standard attaches ``MPI_TAG_UB`` to ``MPI_COMM_WORLD``;
    Open MPI gives a communicator made by ``Split`` none (``Get_attr`` returns None), so fall back to
    the world's, then to the 32767 every implementation must allow."""
    for c in (comm, MPI.COMM_WORLD):
        value = c.Get_attr(MPI.TAG_UB)
        if value is not None:
            return int(value)
    return 32767


def make_layout(ctx, description) -> Layout:
    """The layout of the run `description` (a ``RunDescription``: its job, the model's shape and the
    OSDP plan, checked already) on this job's ranks (``ctx``)."""
    job, model, osdp = description.job, description.skeleton, description.plan_doc
    space = model.space
    total_bytes = space.size * space.dtype.itemsize
    chunk_bytes = ctx.chunk_bytes(job.runtime.chunk_bytes, total_bytes)
    schedule = make_schedule(osdp, model) if osdp and any(e["mode"] == "on-demand" for e in osdp["layers"]) else None
    bounds = _cut([(t.offset, t.size) for t in space.tensors], schedule.cuts() if schedule else [])
    chunks = plan_chunks(bounds, space.dtype.itemsize, chunk_bytes, tag_upper_bound(ctx.comm))
    names, plan = build.hybrid_plan(job, model, ctx.workers)
    sfb = sfb_layers(space, names)
    if schedule is None and ctx.servers == 1:  # several servers each own whole tensors; OSDP, its units
        chunks = _coalesced(chunks, space, {a.name for a in sfb}, min(chunk_bytes, COALESCE_BYTES))
    chunk_parts = parts_of_chunks(space, chunks)
    # an SFB layer's factors rebuild its whole weight tensor on one rank: keep its chunks together
    together = [[k for k, parts in enumerate(chunk_parts) if parts[0][0] == a.name] for a in sfb]
    try:
        shards = plan_shards(chunks, ctx.servers, together)
    except ValueError as e:
        from ...errors import UsageError

        raise UsageError(str(e)) from None
    return Layout(chunks=chunks, chunk_parts=chunk_parts, chunk_bytes=chunk_bytes, sfb=sfb,
                  sfb_bsp=bool(sfb) and round_based(job.sync), hybrid_plan=plan, shards=shards,
                  owner=owner_of_chunks(shards), schedule=schedule, **_units_in_chunks(schedule, chunks))


def _coalesced(chunks: list[Chunk], space, sfb: set[str], limit_bytes: int) -> list[Chunk]:
    """`chunks` with consecutive small whole tensors joined into one message (``protocol.COALESCE_BYTES``);
    a piece of a tensor and an SFB layer's weight (its factors go their own way) stay as they are."""
    whole = {(t.offset, t.offset + t.size) for t in space.tensors if t.name not in sfb}
    mergeable = [(c.start, c.stop) in whole for c in chunks]
    return coalesce_chunks(chunks, mergeable, limit_bytes // space.dtype.itemsize)


def _cut(bounds: list[tuple[int, int]], cuts: list[int]) -> list[tuple[int, int]]:
    """The ``(offset, size)`` runs of `bounds`, each broken at every offset of `cuts` inside it."""
    out = []
    for offset, size in bounds:
        edges = [offset] + [c for c in cuts if offset < c < offset + size] + [offset + size]
        out += [(a, b - a) for a, b in itertools.pairwise(edges)]
    return out


def _units_in_chunks(schedule: Schedule | None, chunks: list[Chunk]) -> dict:
    """``fetched`` and ``unit_chunks`` of the Layout (empty without a schedule)."""
    if schedule is None:
        return {}
    fetched = [False] * len(chunks)
    unit_chunks = []
    for unit in schedule.units:
        mine, base = [], 0
        for a, b in unit.runs:
            for k, c in enumerate(chunks):
                if a <= c.start and c.stop <= b:
                    mine.append((k, base + c.start - a))
                    fetched[k] = True
            base += b - a
        unit_chunks.append(tuple(mine))
    return {"fetched": tuple(fetched), "unit_chunks": tuple(unit_chunks)}


def worker_limits(limits, layout: Layout) -> list[int | None]:
    """Each worker's iteration limit (None: none) as the servers apply it: under BSP with SFB layers
    every replica applies the same rounds, so all stop at the same one."""
    limits = list(limits)
    if layout.sfb_bsp:
        limits = [None if None in limits else min(limits)] * len(limits)
    return limits
