"""What a benchmark may watch of rank 0's work, without reaching into a server's methods.

Rank 0's loop tells its probe when a poll for pushes begins and ends, and its executor when a BSP
round's order begins and ends (``runtime.servers.executor``). The default probe does nothing; ``bench
ps`` passes one that times the server's core (``bench.ps.CoreTimers``)."""

from __future__ import annotations


class ServerProbe:
    """Told of rank 0's polls for pushes and of the BSP rounds it closes; does nothing."""

    def serving(self) -> None:
        """A poll for pushes (``Server._serve_pushes``) begins."""

    def served(self, found: bool) -> None:
        """The poll ends; `found`: some part of a push came."""

    def round_begins(self) -> None:
        """A BSP round's order is carried out."""

    def round_ends(self, closed: bool) -> None:
        """It is done; `closed`: the round closed (False: it waits for a push still to come)."""


#: the probe of every run that is not a benchmark's
NO_PROBE = ServerProbe()
