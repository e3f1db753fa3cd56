"""The figures of ``bench cluster`` from what a run leaves (standard library only, no MPI).

- Seconds per round: the median of the round durations after a warm-up, a round ending when its last
  push reaches the server (the barrier) on rank 0's clock. The median of rounds, not wall / rounds,
  because the wall clock also counts the start (every worker's first pull of the whole model, the
  first rounds' page faults and TCP's slow start) that a round of a longer run does not pay; DDP's
  rounds are its steps, timed on its rank 0 the same way.
- Bytes per round per link: each rank's payload byte counters (``summary.json``'s ``bytes``) summed
  over the ranks of each node, less what stays on the node (a worker's push to, and reply from, a
  server beside it), divided by the rounds. The wire bytes beside them are the busiest link's as its
  veth counted them (TCP/IP and MPI's headers, the start-up and DDP's traffic too), over the rounds.
"""

from __future__ import annotations

import itertools
import statistics
from collections import defaultdict


def barrier_times(iterations, times) -> list[float]:
    """Per iteration in order, the time its last push arrived: when the round's barrier completed."""
    last: dict[int, float] = {}
    for it, t in zip(iterations, times, strict=True):
        last[int(it)] = max(float(t), last.get(int(it), float("-inf")))
    return [last[it] for it in sorted(last)]


def median_round(ends: list[float], warmup: int) -> float:
    """The median seconds between successive round ends, the first `warmup` rounds left out.

    Raises
    ------
    ValueError
        Fewer than one round is left after the warm-up.
    """
    rounds = [b - a for a, b in itertools.pairwise(ends)][warmup:]
    if not rounds:
        raise ValueError(f"{len(ends)} round ends leave no round after a warm-up of {warmup}: run more rounds")
    return statistics.median(rounds)


def round_phases(ends: list[float], workers: list[dict], warmup: int) -> dict[str, float]:
    """Where a round of ours goes, medians after the warm-up, on rank 0's time axis:

    - ``reply_s``: from the barrier of iteration i to the last worker having its reply (its ``t_end``);
    - ``push_s``: from then to the barrier of iteration i+1 (every push in);
    - ``compute_s``: a worker's forward and backward pass (``t_compute_end − t_start``).

    `workers` holds each worker's iteration columns ``t_start``, ``t_compute_end``, ``t_end``, in
    iteration order. While the server replies only once every push is in, reply_s + push_s is the round.
    """
    n = min([len(ends)] + [len(w["t_end"]) for w in workers])
    replied = [max(float(w["t_end"][i]) for w in workers) for i in range(n)]
    reply = [replied[i] - ends[i] for i in range(n - 1)][warmup:]
    push = [ends[i + 1] - replied[i] for i in range(n - 1)][warmup:]
    compute = [float(w["t_compute_end"][i]) - float(w["t_start"][i]) for w in workers for i in range(warmup, n)]
    if not (reply and compute):
        raise ValueError(f"{n} rounds leave none after a warm-up of {warmup}: run more rounds")
    return {"reply_s": statistics.median(reply), "push_s": statistics.median(push),
            "compute_s": statistics.median(compute)}


def link_bytes(ranks: list[dict], workers: int) -> dict[str, tuple[float, float]]:
    """Per node, the payload bytes its link carried out and in: ``{node: (out, in)}``.

    `ranks` holds one dict per rank: ``host``, ``role`` (``server`` or ``worker``), ``sent`` and
    ``received`` (payload bytes, all tensors). Under BSP every worker pushes as often as every other,
    so a server's bytes split evenly over the `workers`: a node keeps, of each of its servers' bytes,
    the share of the workers beside it (their pushes in, its replies out), and that share crosses no
    link.
    """
    sent: dict[str, float] = defaultdict(float)
    received: dict[str, float] = defaultdict(float)
    workers_on: dict[str, int] = defaultdict(int)
    for r in ranks:
        sent[r["host"]] += r["sent"]
        received[r["host"]] += r["received"]
        workers_on[r["host"]] += r["role"] == "worker"
    local: dict[str, float] = defaultdict(float)
    for r in ranks:
        if r["role"] == "server":
            local[r["host"]] += (r["sent"] + r["received"]) * workers_on[r["host"]] / workers
    return {n: (sent[n] - local[n], received[n] - local[n]) for n in sent}


def busiest_link(per_node: dict[str, tuple[float, float]]) -> float:
    """The most bytes one link carried in one direction."""
    return max(max(out, into) for out, into in per_node.values())


def model_bytes(shards, float_bytes: int) -> int:
    """M: the bytes of the model's parameters, from the servers' shards (``[start, end)`` each)."""
    return sum(int(end) - int(start) for start, end in shards) * int(float_bytes)


def spread(values: list[float]) -> str:
    return f"{min(values):.3f}-{max(values):.3f}" if len(values) > 1 else "-"


def summarize(runs: list[dict], bound: float, expected_bytes: float) -> dict:
    """One row of the table from the repetitions of one placement at one rate.

    Each run has ``round_s``, ``samples_per_second`` and ``link_bytes`` (busiest link, bytes per
    round; None where not counted). The ratio is bound / achieved (1: at the physical limit)."""
    ratios = [bound / r["round_s"] for r in runs]
    counted = [r["link_bytes"] for r in runs if r["link_bytes"] is not None]
    return {"round_s": statistics.median(r["round_s"] for r in runs),
            "round_s_runs": [r["round_s"] for r in runs],
            "bound_s": bound,
            "ratio": statistics.median(ratios), "ratio_runs": ratios,
            "samples_per_second": statistics.median(r["samples_per_second"] for r in runs),
            "samples_per_second_runs": [r["samples_per_second"] for r in runs],
            "link_bytes": statistics.median(counted) if counted else None,
            "wire_bytes": statistics.median(r["wire_bytes"] for r in runs),
            **{k: statistics.median(r[k] for r in runs) if all(k in r for r in runs) else None
               for k in ("reply_s", "push_s", "compute_s", "test_accuracy")},
            "expected_bytes": expected_bytes}


def phase_lines(rows: list[dict]) -> list[str]:
    """Where a round of ours goes (:func:`round_phases`), beside the time each direction of the busiest
    link needs for its bytes (half the bound co-located, the bound itself elsewhere)."""
    head = (f"{'rate':<8} {'placement':<10} {'s/round':>8} {'reply phase':>11} {'push phase':>10} "
            f"{'compute':>8} {'one way, bytes / R':>18}")
    lines = [head, "-" * len(head)]
    for r in rows:
        if r.get("reply_s") is None:
            continue
        one_way = r["bound_s"] / 2 if r["placement"] == "colocated" else r["bound_s"]
        lines.append(f"{r['rate']:<8} {r['placement']:<10} {r['round_s']:>8.4f} {r['reply_s']:>11.4f} "
                     f"{r['push_s']:>10.4f} {r['compute_s']:>8.4f} {one_way:>18.4f}")
    return lines


def table_lines(rows: list[dict]) -> list[str]:
    """The table ``bench cluster`` prints: one line per placement and rate (dicts of :func:`summarize`
    with ``rate``, ``placement``, ``formula``, ``reps`` and ``vs_ddp`` added)."""
    head = (f"{'rate':<8} {'placement':<10} {'reps':>4} {'s/round':>8} {'bound':>19} {'bound/achieved':>14} "
            f"{'spread':>11} {'link MB/round':>13} {'/expected':>9} {'wire MB':>8} {'samples/s':>9} {'/DDP':>6} "
            f"{'test acc':>8}")
    lines = [head, "-" * len(head)]
    for r in rows:
        mb = "-" if r["link_bytes"] is None else f"{r['link_bytes'] / 1e6:.3f}"
        of = "-" if r["link_bytes"] is None else f"{r['link_bytes'] / r['expected_bytes']:.3f}"
        vs = "-" if r.get("vs_ddp") is None else f"{r['vs_ddp']:.2f}"
        bound = f"{r['formula']}={r['bound_s']:.3f}"
        wire = f"{r['wire_bytes'] / 1e6:.3f}"
        lines.append(f"{r['rate']:<8} {r['placement']:<10} {r['reps']:>4} {r['round_s']:>8.4f} {bound:>19} "
                     f"{r['ratio']:>14.3f} {spread(r['ratio_runs']):>11} {mb:>13} {of:>9} {wire:>8} "
                     f"{r['samples_per_second']:>9.0f} {vs:>6} {_accuracy(r.get('test_accuracy')):>8}")
    return lines


def _accuracy(acc) -> str:
    """The final test accuracy (median over the repetitions): after the same rounds, the runs of a
    rate must learn alike, whatever carried their gradients."""
    return "-" if acc is None else f"{acc:.4f}"
