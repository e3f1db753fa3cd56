"""What ``bench cluster`` runs where, and the least time a round can take there (standard library only).

A placement says which node each rank runs on; its bound is the time the busiest link needs to move
one BSP round's bytes at rate R, both directions at once (a link of rate R moves R bytes/s each way).
With M the model's bytes and W workers:

- ``one``: one server (rank 0) alone on a node, a worker on each of W other nodes. The server's node
  receives W·M (the pushes) and sends W·M (the replies): ``W·M / R``.
- ``spreadK``: K servers, each alone on a node, the workers on W others: each server's node moves a
  K-th of that, ``W·M / (K·R)``.
- ``colocated``: a server on each worker's node (K = W, one of each per node). A node sends its
  worker's push to the W−1 other servers and its server's replies to the W−1 other workers:
  ``2·M·(W−1) / (W·R)``.

Where the servers' shards are not even (they split at message boundaries), the largest shard S
takes M/K's place: ``W·S / R`` and ``(M + (W−2)·S) / R``.
- ``ddp``: PyTorch DDP's ring all-reduce, one process per node: each node sends and receives
  ``2·M·(W−1)/W``, the same bound as ``colocated``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from ..errors import UsageError

#: tc's rate units (tc-tbf(8): decimal multiples of bits per second), in bits per second
RATE_UNITS = {"bit": 1, "kbit": 10**3, "mbit": 10**6, "gbit": 10**9}


def rate_bytes(text: str) -> float:
    """A tc rate (``200mbit``, ``1gbit``) in bytes per second.

    Raises
    ------
    UsageError
        Not a positive number followed by one of bit, kbit, mbit, gbit (one line).
    """
    m = re.fullmatch(r"\s*([0-9]+(?:\.[0-9]+)?)\s*([a-z]+)\s*", text.lower())
    if not m or m.group(2) not in RATE_UNITS or float(m.group(1)) <= 0:
        raise UsageError(f"bench cluster: rate {text!r}: expected a number above 0 and one of "
                         f"{', '.join(RATE_UNITS)} (as tc takes it: 200mbit, 1gbit)")
    return float(m.group(1)) * RATE_UNITS[m.group(2)] / 8


@dataclass(frozen=True)
class Placement:
    """Where each rank of one run goes: ``hosts[r]`` is rank r's node (n1, n2, ...).

    ``servers`` is the number of server ranks (ranks 0 .. servers−1, as ``runtime.servers`` makes
    them); 0 for DDP, whose W ranks are all workers."""

    name: str
    servers: int
    workers: int
    hosts: tuple[str, ...]

    @property
    def nodes(self) -> int:
        return len(set(self.hosts))

    @property
    def is_ddp(self) -> bool:
        return self.name == "ddp"

    def hydra_hosts(self) -> str:
        """Hydra's ``-hosts`` for this placement: each node once, in the order ranks fill them
        (Hydra gives rank r the (r mod N)-th host)."""
        return ",".join(dict.fromkeys(self.hosts))

    def bound_seconds(self, model_bytes: float, rate: float, shard_bytes: float | None = None) -> float:
        """The least seconds one BSP round takes on links of `rate` bytes/s (module docstring).

        `shard_bytes` is the largest server's share of the `model_bytes` (M/K when the shards are
        even): the busiest node is that server's."""
        w, m = self.workers, model_bytes
        if self.is_ddp:
            return 2 * m * (w - 1) / (w * rate)
        s = m / self.servers if shard_bytes is None else shard_bytes
        if self.name == "colocated":
            # its worker's push to the others' servers (M - S) and its server's replies to the W-1 others
            return (m - s + (w - 1) * s) / rate
        return w * s / rate

    def formula(self) -> str:
        if self.name == "colocated" or self.is_ddp:
            return "2M(W-1)/(WR)"
        return "WM/R" if self.servers == 1 else f"WM/({self.servers}R)"


def node(i: int) -> str:
    return f"n{i + 1}"


def placement(name: str, workers: int) -> Placement:
    """The placement called `name` (``one``, ``spreadK``, ``colocated``, ``ddp``) for `workers` workers.

    Raises
    ------
    UsageError
        An unknown name, or one that moves no byte across a link (one line).
    """
    w = workers
    if name == "one":
        name, k = "spread1", 1
    if m := re.fullmatch(r"spread([1-9][0-9]*)", name):
        k = int(m.group(1))
        # Hydra fills -hosts round robin: servers on n1..nK, then the workers on nK+1..nK+W
        hosts = tuple(node(i) for i in range(k + w))
        return Placement("one" if k == 1 else name, k, w, hosts)
    if name in ("colocated", "ddp"):
        if w < 2:
            raise UsageError(f"bench cluster: placement {name} with {w} worker moves nothing across a link: "
                             "give --workers 2 or more")
        if name == "ddp":
            return Placement(name, 0, w, tuple(node(i) for i in range(w)))
        # ranks 0..W-1 are the servers, W..2W-1 the workers: both round robin over n1..nW
        return Placement(name, w, w, tuple(node(i % w) for i in range(2 * w)))
    raise UsageError(f"bench cluster: placement {name!r}: expected one, spreadK (K servers on nodes of "
                     "their own: spread2, spread4), colocated or ddp")
