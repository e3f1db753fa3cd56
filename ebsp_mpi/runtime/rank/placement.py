"""Whether the launcher put the servers on nodes of their own (``runtime.servers_alone``); pure.

A server's node carries W pushes in and W replies out a round (W·M/(k·R) at best, docs/cluster.md); a
worker beside it adds its own push and reply to the same link and takes a core the server's message
loop wants. Where the job asks for servers alone, a launch that placed a worker beside a server is
refused at start-up, naming the nodes, instead of running slower than the user planned.
"""

from __future__ import annotations


def workers_beside_servers(hosts: list[str], servers: int) -> dict[str, tuple[list[int], list[int]]]:
    """Each node that runs a server rank and a worker rank: ``{node: (server ranks, worker ranks)}``.

    `hosts` is every rank's node, in rank order; ranks 0..servers−1 are the servers."""
    shared = {}
    for node in dict.fromkeys(hosts):
        ranks = [r for r, h in enumerate(hosts) if h == node]
        held = [r for r in ranks if r < servers], [r for r in ranks if r >= servers]
        if held[0] and held[1]:
            shared[node] = held
    return shared


def servers_alone_refusal(hosts: list[str], servers: int) -> str:
    """The one-line refusal of a launch that put a worker beside a server ("" when none did)."""
    shared = workers_beside_servers(hosts, servers)
    if not shared:
        return ""
    where = "; ".join(f"{node} runs server rank{'s' * (len(s) > 1)} {', '.join(map(str, s))} and worker "
                      f"rank{'s' * (len(w) > 1)} {', '.join(map(str, w))}" for node, (s, w) in shared.items())
    return (f"runtime.servers_alone = true, but {where}: give the {servers} server rank(s) nodes of their own "
            f"(Hydra: -hosts with the servers' nodes first; Slurm: --distribution=arbitrary with SLURM_HOSTFILE; "
            f"docs/cluster.md) or set runtime.servers_alone = false")
