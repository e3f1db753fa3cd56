"""Poseidon's hybrid communication on the wire (``comm.hybrid``; docs/design.md, "Hybrid communication").

The plan (``ebsp_mpi.plan.hybcomm``, made the same on every rank from the job) names the dense layers
whose weight gradient travels as *sufficient factors* (SFB): a worker's ``V`` (its input to the layer,
K x d_in) and ``U`` (the error at the layer's output, K x d_out), two messages per layer, on a
communicator of their own (``Context.factor_comm``), tags ``2i`` and ``2i + 1`` for the i-th SFB layer.
Every rank keeps every worker's factors of a layer stacked in worker order (:class:`Stacked`), so a
worker's message lands in its rows and the summed gradient ``V_all.T @ U_all`` is one GEMM.

- **BSP**: a worker sends its factors to every other worker and to the server; every receiver rebuilds
  the round's mean gradient from the round's members (the server names them in its reply) and applies
  the same optimizer step, so the workers never pull an SFB layer after the first pull. Every replica
  must apply the same rounds, so all workers stop at the same one (the smallest iteration limit).
- **ASP, SSP, DSSP, ElasticBSP** (Project Adam's variant): the push of an SFB layer carries its factors
  to the server, which rebuilds that worker's gradient and applies it; pulls stay dense.

A bias, and every conv layer, always goes through the server. Every rank counts the payload bytes it
sends and receives per tensor and scheme (:class:`ByteCounter`): the traces and summary.json hold them.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from mpi4py import MPI

PS, SFB = "ps", "sfb"


@dataclass(frozen=True)
class SFBLayer:
    """A dense layer whose weight gradient travels as factors: its W tensor's name, shape and offset in
    the ParamSpace, and its position among the SFB layers (its message tags)."""

    name: str
    d_in: int
    d_out: int
    offset: int
    index: int

    @property
    def size(self) -> int:
        return self.d_in * self.d_out

    @property
    def params(self) -> slice:
        return slice(self.offset, self.offset + self.size)


def sfb_layers(space, names) -> list[SFBLayer]:
    """The SFB layers of a model's ParamSpace, in buffer order (the order backward reaches them reversed)."""
    out = []
    for t in space.tensors:
        if t.name in names:
            d_in, d_out = t.shape
            out.append(SFBLayer(t.name, int(d_in), int(d_out), t.offset, len(out)))
    return out


class Stacked:
    """Every worker's factors of every SFB layer, stacked in worker order: ``V[name]`` of shape
    (workers * batch, d_in) and ``U[name]`` (workers * batch, d_out); worker w's are rows
    ``w * batch .. (w + 1) * batch``."""

    def __init__(self, layers: list[SFBLayer], workers: int, batch: int):
        self.layers, self.workers, self.batch = layers, workers, batch
        self.V = {a.name: np.empty((workers * batch, a.d_in), dtype=np.float32) for a in layers}
        self.U = {a.name: np.empty((workers * batch, a.d_out), dtype=np.float32) for a in layers}

    def rows(self, worker: int) -> slice:
        return slice(worker * self.batch, (worker + 1) * self.batch)

    def of(self, layer: SFBLayer, members: list[int]):
        """``(V_all, U_all)`` of `members` (worker indices, ascending): views when every worker is a
        member, else copies of their rows (a round with a rejected push)."""
        V, U = self.V[layer.name], self.U[layer.name]
        if len(members) == self.workers:
            return V, U
        rows = np.concatenate([np.arange(w * self.batch, (w + 1) * self.batch) for w in members])
        return V[rows], U[rows]

    def receives(self, comm, sender_of, workers) -> list[tuple]:
        """Persistent receives of `workers`' factors of every layer into their rows (``sender_of(w)``:
        the rank of worker w), V then U of each layer, worker by worker: ``(request, layer name,
        the rows received into, flat)``."""
        out = []
        for w in workers:
            for a in self.layers:
                for tag, buf in ((2 * a.index, self.V[a.name]), (2 * a.index + 1, self.U[a.name])):
                    piece = buf[self.rows(w)].reshape(-1)
                    out.append((comm.Recv_init([piece, MPI.FLOAT], sender_of(w), tag), a.name, piece))
        return out


class ByteCounter:
    """Payload bytes this rank sent and received, per tensor and scheme (headers not counted)."""

    def __init__(self):
        self.counts: dict[tuple[str, str], list[int]] = {}
        self.deferred: list = []

    def defer(self, settle) -> None:
        """Call ``settle()`` before the counts are read: a sender that counts its messages cheaply
        (how many, not how many bytes each time) adds their bytes there."""
        self.deferred.append(settle)

    def sent(self, tensor: str, scheme: str, nbytes: int) -> None:
        self.counts.setdefault((tensor, scheme), [0, 0])[0] += int(nbytes)

    def received(self, tensor: str, scheme: str, nbytes: int) -> None:
        self.counts.setdefault((tensor, scheme), [0, 0])[1] += int(nbytes)

    def as_dict(self) -> dict:
        """``{tensor: {scheme: {"sent": bytes, "received": bytes}}}``, plus ``"total"`` per scheme."""
        for settle in self.deferred:
            settle()
        out: dict = {}
        totals: dict = {}
        for (tensor, scheme), (s, r) in sorted(self.counts.items()):
            out.setdefault(tensor, {})[scheme] = {"sent": s, "received": r}
            t = totals.setdefault(scheme, {"sent": 0, "received": 0})
            t["sent"] += s
            t["received"] += r
        out["total"] = totals
        return out


def parts_of_chunks(space, chunks) -> tuple[tuple[tuple[str, int], ...], ...]:
    """Per chunk, ``(tensor, elements)`` of each tensor it holds part of, in buffer order: one tensor,
    or several for a chunk that joins small ones (``protocol.coalesce_chunks``); what the byte
    counters charge each tensor for the chunk's message."""
    return tuple(tuple((t.name, min(c.stop, t.offset + t.size) - max(c.start, t.offset)) for t in space.tensors
                       if t.offset < c.stop and c.start < t.offset + t.size) for c in chunks)
