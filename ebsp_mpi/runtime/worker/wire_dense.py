"""A worker's dense wire (PS): its gradient chunks to the servers that own them, the push header to every
server, and the weights back, each chunk from its owner and the reply's header from rank 0.

Every message runs on a persistent request made once on a fixed slice of the worker's buffers (the
``ParamSpace`` buffers on the CPU; host mirrors on a GPU without CUDA-aware MPI, :class:`WireBuffers`).
The pull receives are posted before the push header is sent, so the server's reply always finds them;
neither buffer is written while a request on it is active.

When each chunk goes is the caller's choice: :meth:`DenseWire.push_ready` as the backward pass makes a
tensor's rows final (wait-free backprop), :meth:`DenseWire.push_rest` for all the others after it.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from mpi4py import MPI

from ...nn.kernels import all_finite
from ..transport.hybrid import PS
from ..transport.protocol import PULL_FIELDS, PULL_TAG, PUSH_FIELDS, PUSH_TAG, header, pack


@dataclass(frozen=True)
class WireBuffers:
    """The buffers MPI reads the gradient from and writes the weights into.

    Attributes
    ----------
    space : ParamSpace
        The worker's parameters and gradient, on its device.
    params, grad : array
        ``space.data`` and ``space.grad`` themselves, or host mirrors of them (`staged`).
    staged : bool
        A GPU without CUDA-aware MPI: MPI runs on host mirrors, copied to and from the device.
    backend : Backend
    """

    space: object
    params: object
    grad: object
    staged: bool
    backend: object

    @classmethod
    def of(cls, space, backend, cuda_aware_mpi: bool) -> WireBuffers:
        direct = backend.name == "numpy" or cuda_aware_mpi
        params = space.data if direct else backend.host_empty(space.data.size)
        grad = space.grad if direct else backend.host_empty(space.grad.size)
        return cls(space=space, params=params, grad=grad, staged=not direct, backend=backend)

    @property
    def host_params(self) -> bool:
        """Whether ``params`` is host memory (the optimizer of the SFB layers steps it in place)."""
        return self.staged or self.backend.name == "numpy"


class FiniteCheck:
    """Whether every value pushed so far in this push is finite: its header tells every server, which
    then rejects the push whole or applies it."""

    def __init__(self):
        self.ok = True

    def reset(self) -> None:
        self.ok = True

    def __call__(self, values) -> None:
        self.ok = self.ok and all_finite(values)


@dataclass(frozen=True)
class Requests:
    """Requests to complete together, and the rank each is with (for the stall watchdog's message)."""

    requests: list
    ranks: list[int]
    first: bool = False  # of a pull: the initial one, of every held tensor


class DenseWire:
    """A worker's PS messages (see the module docstring).

    Parameters
    ----------
    ctx : Context
    layout : Layout
    buffers : WireBuffers
    bytes : ByteCounter
    check : FiniteCheck
    sfb_chunk : numpy.ndarray of bool
        Per chunk: it belongs to a layer whose gradient goes as sufficient factors (never pushed here).
    """

    def __init__(self, ctx, layout, buffers: WireBuffers, bytes, check: FiniteCheck, sfb_chunk: np.ndarray):
        comm, chunks, owner = ctx.comm, layout.chunks, layout.owner
        self.buf, self.bytes, self.check = buffers, bytes, check
        self.chunks = chunks
        space = buffers.space
        # where each chunk lies in this worker's buffers (None: an on-demand unit's, never held there)
        self.local = [_local_slice(space, layout.chunk_tensor[k], c) for k, c in enumerate(chunks)]
        held = [k for k, at in enumerate(self.local) if at is not None]
        # the servers that read this worker's gradient where it lies (transport.push_window): their
        # chunks are pushed without a message, and the header tells them the gradient is there
        window = ctx.push_window
        readers = set(window.servers_reading(ctx.rank)) if window is not None else set()
        self.window = window if readers else None
        self.in_place = np.array([owner[k] in readers for k in range(len(chunks))], dtype=bool)
        self.pushes = {k: comm.Send_init([buffers.grad[self.local[k]], MPI.FLOAT], owner[k], chunks[k].tag)
                       for k in held if not self.in_place[k]}
        self.push_header = header(PUSH_FIELDS)
        # the header last, to every server: it completes the push on each
        self.header_sends = [comm.Send_init([self.push_header, MPI.DOUBLE], s, PUSH_TAG) for s in range(ctx.servers)]
        # an SFB layer's weight gradient goes as factors, an on-demand unit's from the fetch buffer
        self.never_sent = sfb_chunk | np.array([at is None for at in self.local], dtype=bool)
        self.started = self.never_sent | self.in_place  # chunks of the current push already sent
        self.chunks_of = _chunks_of_tensors(space, chunks)  # tensor name -> indices of its chunks
        # BSP with SFB: the reply's tail names the round's members
        self.pull_header = np.zeros(len(PULL_FIELDS) + (ctx.workers if layout.sfb_bsp else 0))
        chunk_pulls = {k: comm.Recv_init([buffers.params[self.local[k]], MPI.FLOAT], owner[k], chunks[k].tag)
                       for k in held}
        header_pull = comm.Recv_init([self.pull_header, MPI.DOUBLE], 0, PULL_TAG)
        self.first_chunks = held
        # after the first pull, BSP's replies leave out the SFB layers, which every worker steps itself
        self.pulled_chunks = [k for k in held if not (layout.sfb_bsp and sfb_chunk[k])]
        self.first = Requests([header_pull] + [chunk_pulls[k] for k in held], [0] + [owner[k] for k in held],
                              first=True)
        self.later = Requests([header_pull] + [chunk_pulls[k] for k in self.pulled_chunks],
                              [0] + [owner[k] for k in self.pulled_chunks])
        # everything a push sends: completed before the gradient is written again
        self.outgoing = Requests(list(self.pushes.values()) + self.header_sends,
                                 [owner[k] for k in self.pushes] + list(range(ctx.servers)))
        # every push sends the same chunks and every pull receives the same: the byte counts are
        # multiplied out when read (ByteCounter.defer), not added up message by message
        sent = [k for k in held if not self.never_sent[k]]
        self.per_push = _bytes_per_tensor(sent, layout, buffers.grad.itemsize)
        self.per_pull = {True: _bytes_per_tensor(held, layout, buffers.params.itemsize),
                         False: _bytes_per_tensor(self.pulled_chunks, layout, buffers.params.itemsize)}
        self.pushes_done, self.pulls_done = 0, {True: 0, False: 0}
        bytes.defer(self._settle_counts)
        # what the NaN/Inf check reads once per push, after the last chunk went: the sent chunks'
        # slices, merged where they touch (one run for a model without SFB or on-demand layers)
        self.check_runs = _merged([self.local[k] for k in sent])

    def begin_push(self) -> None:
        self.started[:] = self.never_sent | self.in_place

    def push_ready(self, name: str, stop: int) -> None:
        """Wait-free backprop: send the chunks of tensor `name` that lie within its first `stop`
        elements, whose gradient the backward pass has just made final."""
        end = self.buf.space.view(name).offset + stop
        self._push_chunks([k for k in self.chunks_of[name] if self.chunks[k].stop <= end])

    def push_rest(self) -> None:
        """Send the chunks of this push not sent yet (all of them without wait-free backprop), then
        check what the push sent for NaN and Inf: the header, sent after this, carries the verdict.
        One check over the whole gradient costs a few microseconds; one per chunk cost the Python
        around it again for each chunk."""
        self._push_chunks(range(len(self.chunks)))
        for run in self.check_runs:
            self.check(self.buf.grad[run])
        self.pushes_done += 1

    def _push_chunks(self, indices) -> None:
        """Start the sends of the gradient chunks `indices` that have not gone out yet in this push."""
        buf = self.buf
        if not buf.staged and buf.backend.name != "numpy":
            buf.backend.synchronize()  # CUDA-aware MPI reads the device buffer: the kernels must be done
        for k in indices:
            if self.started[k]:
                continue
            at = self.local[k]
            if buf.staged:  # the device has finished this slice (the copy waits for the stream)
                buf.backend.copy_to_host(buf.grad[at], buf.space.grad[at])
            self.pushes[k].Start()
            self.started[k] = True

    def post_pull(self) -> Requests:
        """Post the receives of the next reply (before the header goes, so that it finds them)."""
        MPI.Prequest.Startall(self.later.requests)
        return self.later

    def post_redo(self) -> Requests:
        """Post the receives of a redone BSP round's corrected weights (``runtime.servers.round_stream``): the
        reply's chunks again, no header; counted as one more pull."""
        again = Requests(self.later.requests[1:], self.later.ranks[1:])
        MPI.Prequest.Startall(again.requests)
        self.pulls_done[False] += 1
        return again

    def start_first_pull(self) -> Requests:
        """Post the receives of the initial weights, every held tensor."""
        MPI.Prequest.Startall(self.first.requests)
        return self.first

    def send_header(self, **fields) -> None:
        """Complete the push on every server: its header (:data:`~ebsp_mpi.runtime.transport.protocol.PUSH_FIELDS`)."""
        pack(self.push_header, PUSH_FIELDS, **fields)
        if self.window is not None:  # the gradient read in place is written before the header says so
            self.window.sync()
        MPI.Prequest.Startall(self.header_sends)

    def count_pull(self, first: bool) -> None:
        """Count the pull just received (its bytes are added up when the counts are read). The reply
        has come, so every server has read the push in place: the gradient may be written again."""
        self.pulls_done[first] += 1
        if self.window is not None:
            self.window.sync()

    def _settle_counts(self) -> None:
        """Add the bytes of the pushes and pulls counted so far to the byte counter."""
        for tensor, nbytes in self.per_push if self.pushes_done else ():
            self.bytes.sent(tensor, PS, nbytes * self.pushes_done)
        for first, n in self.pulls_done.items():
            for tensor, nbytes in self.per_pull[first] if n else ():
                self.bytes.received(tensor, PS, nbytes * n)
        self.pushes_done, self.pulls_done = 0, {True: 0, False: 0}


def _bytes_per_tensor(indices, layout, itemsize: int) -> list[tuple[str, int]]:
    """``(tensor, bytes)`` of the chunks `indices`, summed per tensor (a chunk may join several)."""
    out: dict[str, int] = {}
    for k in indices:
        for tensor, elements in layout.parts(k):
            out[tensor] = out.get(tensor, 0) + elements * itemsize
    return list(out.items())


def _merged(slices) -> list[slice]:
    """`slices` (step 1) sorted, with those that touch or overlap joined into one."""
    runs: list[list[int]] = []
    for s in sorted(slices, key=lambda s: s.start):
        if runs and s.start <= runs[-1][1]:
            runs[-1][1] = max(runs[-1][1], s.stop)
        else:
            runs.append([s.start, s.stop])
    return [slice(a, b) for a, b in runs]


def _local_slice(space, tensor: str, c) -> slice | None:
    """Where chunk `c` of `tensor` lies in the worker's ``ParamSpace`` buffers; None when the tensor
    is not held there (an OSDP on-demand layer's)."""
    if not space.holds(tensor):
        return None
    start = space.local_offset(tensor) + c.start - space.view(tensor).offset
    return slice(start, start + c.size)


def _chunks_of_tensors(space, chunks) -> dict[str, list[int]]:
    """Which chunks (by index) hold each tensor of `space`, for wait-free backprop: those within it. A
    chunk that joins small tensors is no one tensor's, and goes with the rest of the push."""
    return {t.name: [k for k, c in enumerate(chunks) if t.offset <= c.start and c.stop <= t.offset + t.size]
            for t in space.tensors}
