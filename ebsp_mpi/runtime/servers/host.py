"""What a server rank adds to the orders it carries out (``runtime.servers.executor``).

Ranks 1..k-1 add nothing (:class:`Host`). Rank 0, the scheduler, adds what only it sends or keeps
(:class:`SchedulerHost`): a reply's header (the version, stop, flush, redo, and under BSP with SFB
the last round's members), the trace's pull rows, when each worker was last heard from and told
that the server lives, and the warning of a rejected push.
"""

from __future__ import annotations

import logging

import numpy as np

from ..transport.keepalive import KeepAlive
from .orders import RejectOrder, ReplyOrder, RoundOrder
from ..transport.protocol import PULL_FIELDS, pack

log = logging.getLogger(__name__)


class Host:
    """What a server rank adds to the orders it carries out; ranks 1..k-1 add nothing (this class)."""

    def reply_header(self, order: ReplyOrder, redo: bool) -> np.ndarray | None:
        """The reply's header (rank 0 sends it); `redo`: a BSP round's weights went twice."""
        return None

    def replied(self, order: ReplyOrder) -> None:
        """The reply is on its way."""

    def rejected(self, order: RejectOrder) -> None:
        """The push is taken in, never applied."""

    def round_closed(self, order: RoundOrder) -> None:
        """The round is applied; its replies follow."""


class SchedulerHost(Host):
    """Rank 0's part of each order, and what it keeps per worker for it.

    Parameters
    ----------
    ctx : Context
    trace : the server's trace (its ``pulls`` rows)
    sfb_bsp : bool
        BSP with SFB layers: a reply's header carries the last round's members.
    stall_timeout_s : float
        ``runtime.stall_timeout_s``: the keep-alives' period is a quarter of it.
    """

    def __init__(self, ctx, trace, sfb_bsp: bool, stall_timeout_s: float):
        n = ctx.workers
        self.ctx, self.trace, self.sfb_bsp = ctx, trace, sfb_bsp
        self.reply_len = len(PULL_FIELDS) + (n if sfb_bsp else 0)
        self.round_mask = np.zeros(n)  # the last round's members: the workers rebuild the SFB layers' mean
        self.flush_asked = np.zeros(n, dtype=bool)  # a checkpoint was written: flush your trace
        self.pull_requested = np.zeros(n)  # when each worker's pending pull arrived (its push time)
        self.last_heard = np.zeros(n)
        self.alive = KeepAlive(ctx.comm, stall_timeout_s)  # to the workers whose pulls are held
        self.t_event = 0.0  # the run time of the event whose orders are being carried out

    def start(self, t: float) -> None:
        """Every worker is heard from, told and asks for its first weights at run time `t`."""
        self.last_heard[:] = t
        self.pull_requested[:] = t
        for w in range(self.ctx.workers):
            self.alive.told(self.ctx.worker_rank(w), t)

    def rejected(self, order: RejectOrder) -> None:
        log.warning("rejected push %d of rank %d: NaN or Inf in the gradient or its step", order.iteration,
                    self.ctx.worker_rank(order.worker))

    def round_closed(self, order: RoundOrder) -> None:
        self.round_mask[:] = 0.0
        self.round_mask[list(order.members)] = 1.0

    def reply_header(self, order: ReplyOrder, redo: bool) -> np.ndarray:
        w = order.worker
        head = np.zeros(self.reply_len)
        pack(head[:len(PULL_FIELDS)], PULL_FIELDS, version=order.version, stop=1.0 if order.stop else 0.0,
             flush=float(self.flush_asked[w]), redo=float(redo))
        if self.sfb_bsp:
            head[len(PULL_FIELDS):] = self.round_mask
        self.flush_asked[w] = False
        return head

    def replied(self, order: ReplyOrder) -> None:
        w, t = order.worker, self.t_event
        self.last_heard[w] = t
        self.alive.told(self.ctx.worker_rank(w), t)
        self.trace.append("pulls", worker=w, t_request=self.pull_requested[w], t_reply=t, version=order.version)
