"""Deadlines on a wait: a rank that owes this one a message and stays silent is named, never waited for."""

from __future__ import annotations

import time

from .failures import StallError


class Silence:
    """A deadline on a wait: :meth:`check` raises :class:`~.failures.StallError` with `what` once no message has
    come for `timeout_s` seconds since :meth:`heard` (or since it was made).

    Parameters
    ----------
    timeout_s : float
        Seconds of silence allowed (``runtime.stall_timeout_s``).
    what : str or callable
        Who is silent, for the message (e.g. ``"the server (rank 0)"``), or a function that says it
        when the deadline passes (e.g. the ranks whose messages a wait still lacks).
    keepalive : MPI.Prequest, optional
        A persistent receive of the peer's keep-alive messages (``protocol.ALIVE_TAG``), started: each
        one that arrives counts as a message, and the receive is posted again.
    ranks : tuple of int or callable
        The silent ranks (or a function that says them), for :class:`~.failures.StallError`.
    """

    #: a check looks at the clock and the keep-alive at most this often: a waiting rank polls every
    #: 20 - 200 us, and each look costs an MPI call, where the deadline is seconds away
    EVERY_S = 2e-3

    def __init__(self, timeout_s: float, what: str, keepalive=None, ranks=()):
        self.timeout_s, self.what, self.keepalive, self.ranks = timeout_s, what, keepalive, ranks
        self.next_look = 0.0
        self.heard()

    def heard(self) -> None:
        self.since = time.monotonic()

    def check(self) -> None:
        now = time.monotonic()
        if now < self.next_look:
            return
        self.next_look = now + self.EVERY_S
        if self.keepalive is not None and self.keepalive.Test():
            self.keepalive.Start()
            self.heard()
            return
        silent = time.monotonic() - self.since
        if silent > self.timeout_s:
            what = self.what() if callable(self.what) else self.what
            raise StallError(f"{what} sent nothing for {silent:.1f} s (runtime.stall_timeout_s = "
                             f"{self.timeout_s}); it may have died or hung",
                             self.ranks() if callable(self.ranks) else self.ranks)


class Deadline:
    """A fixed deadline on a wait, unlike :class:`Silence` not moved by what arrives (the set-up
    exchange, where each peer sends one message): :meth:`check` raises :class:`~.failures.StallError` with
    ``say()``'s text and ``ranks()``'s silent ranks once `timeout_s` have passed since it was made."""

    def __init__(self, timeout_s: float, say, ranks=tuple):
        self.end, self.say, self.ranks = time.monotonic() + timeout_s, say, ranks

    def heard(self) -> None:
        pass

    def check(self) -> None:
        if time.monotonic() > self.end:
            raise StallError(self.say(), self.ranks())
