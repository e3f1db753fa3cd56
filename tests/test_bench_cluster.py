"""``bench cluster``'s pure parts: placements, bounds, per-node bytes, round times, the table, refusals.

No MPI, no root: the benchmark itself runs end to end only in ``.ci/cluster-check.sh`` (check ``bench``).
"""

import subprocess
import sys

import pytest

from ebsp_mpi.bench.cluster_figures import (barrier_times, busiest_link, link_bytes, median_round, model_bytes,
                                            phase_lines, round_phases, summarize, table_lines)
from ebsp_mpi.bench.cluster_plan import placement, rate_bytes
from ebsp_mpi.errors import UsageError
from mpirun import child_env

M = 1_068_810 * 4          # the issue's MLP 784-1024-256-10 in float32
R200 = 200e6 / 8           # 200 Mbit/s in bytes/s


def test_rates_are_read_as_tc_reads_them():
    assert rate_bytes("200mbit") == 25e6
    assert rate_bytes("1gbit") == 125e6
    assert rate_bytes("1.5kbit") == 187.5
    for bad in ("200mbps", "fast", "0mbit", "-1gbit", ""):
        with pytest.raises(UsageError, match="tc takes it"):
            rate_bytes(bad)


def test_placements_put_each_rank_on_its_node():
    one = placement("one", 4)
    assert (one.servers, one.hosts, one.nodes) == (1, ("n1", "n2", "n3", "n4", "n5"), 5)
    spread = placement("spread2", 4)   # servers alone on n1, n2; never beside a worker
    assert spread.hosts == ("n1", "n2", "n3", "n4", "n5", "n6") and spread.servers == 2
    assert not set(spread.hosts[:2]) & set(spread.hosts[2:])
    colocated = placement("colocated", 4)   # ranks 0-3 servers, 4-7 workers, one of each per node
    assert colocated.hosts == ("n1", "n2", "n3", "n4") * 2 and colocated.servers == 4
    assert colocated.hydra_hosts() == "n1,n2,n3,n4"
    ddp = placement("ddp", 4)
    assert (ddp.servers, ddp.hosts) == (0, ("n1", "n2", "n3", "n4"))


@pytest.mark.parametrize("name, workers", [("colocated", 1), ("ddp", 1), ("spread0", 4), ("two", 4)])
def test_a_placement_that_cannot_be_measured_is_refused(name, workers):
    with pytest.raises(UsageError, match="bench cluster: placement"):
        placement(name, workers)


def test_bounds_are_the_issues():
    # the issue's table: W·M/R = 0.68 s for one server, 2·M·(W−1)/(W·R) = 0.26 s co-located and for DDP
    assert placement("one", 4).bound_seconds(M, R200) == pytest.approx(4 * M / R200)
    assert round(placement("one", 4).bound_seconds(M, R200), 2) == 0.68
    assert placement("spread2", 4).bound_seconds(M, R200) == pytest.approx(4 * M / (2 * R200))
    assert placement("spread4", 4).bound_seconds(M, R200) == pytest.approx(4 * M / (4 * R200))
    for name in ("colocated", "ddp"):
        assert placement(name, 4).bound_seconds(M, R200) == pytest.approx(2 * M * 3 / (4 * R200))
        assert round(placement(name, 4).bound_seconds(M, R200), 2) == 0.26


def test_uneven_shards_bind_at_the_largest():
    # two servers holding 40 % and 60 %: the busier node moves W·0.6·M
    assert placement("spread2", 4).bound_seconds(1000, 1.0, shard_bytes=600) == pytest.approx(4 * 600)
    # co-located, W = 2, shards 400/600: node 2 sends its worker's 400 to server 1 and its server's 600 to worker 1
    assert placement("colocated", 2).bound_seconds(1000, 1.0, shard_bytes=600) == pytest.approx(1000)
    assert placement("colocated", 4).bound_seconds(1000, 1.0, shard_bytes=250) == pytest.approx(1500)


def counters(hosts, shards, workers, rounds, model):
    """Each rank's payload bytes in a BSP run: servers first (shard sizes), then the workers; each
    worker pulls the whole model once at the start and once per round, and pushes once per round."""
    ranks = [{"host": h, "role": "server", "sent": workers * s * (rounds + 1), "received": workers * s * rounds}
             for h, s in zip(hosts, shards, strict=False)]
    ranks += [{"host": h, "role": "worker", "sent": model * rounds, "received": model * (rounds + 1)}
              for h in hosts[len(shards):]]
    return ranks


def test_one_servers_node_carries_every_workers_bytes():
    ranks = counters(["n1", "n2", "n3"], [1000], workers=2, rounds=10, model=1000)
    per_node = link_bytes(ranks, workers=2)
    assert per_node == {"n1": (2 * 1000 * 11, 2 * 1000 * 10), "n2": (10_000, 11_000), "n3": (10_000, 11_000)}
    assert busiest_link(per_node) == 22_000


def test_what_stays_on_a_node_crosses_no_link():
    # co-located, W = 2, shards 400/600: by hand, n1 sends worker 0's pushes of shard 1 (600 a round) and
    # server 0's replies to worker 1 (400 a round and at the start); n1 receives the mirror
    ranks = counters(["n1", "n2", "n1", "n2"], [400, 600], workers=2, rounds=10, model=1000)
    per_node = link_bytes(ranks, workers=2)
    assert per_node["n1"] == pytest.approx((600 * 10 + 400 * 11, 600 * 11 + 400 * 10))
    assert per_node["n2"] == pytest.approx((400 * 10 + 600 * 11, 400 * 11 + 600 * 10))
    # every node alone: nothing stays, the sums are the ranks' own
    alone = counters(["n1", "n2", "n3", "n4"], [400, 600], workers=2, rounds=10, model=1000)
    assert link_bytes(alone, workers=2)["n3"] == (10_000, 11_000)


def test_a_round_ends_with_its_last_push_and_the_warm_up_is_left_out():
    # pushes out of order; iteration 0 ends at 1.0, 1 at 3.0, 2 at 4.0, 3 at 4.5
    ends = barrier_times([0, 1, 0, 1, 2, 3, 2, 3], [0.5, 2.0, 1.0, 3.0, 3.5, 4.5, 4.0, 4.2])
    assert ends == [1.0, 3.0, 4.0, 4.5]
    assert median_round(ends, warmup=0) == 1.0     # rounds of 2.0, 1.0, 0.5
    assert median_round(ends, warmup=1) == 0.75    # 1.0, 0.5
    with pytest.raises(ValueError, match="no round after a warm-up of 3"):
        median_round(ends, warmup=3)


def test_a_round_splits_into_the_replies_then_the_pushes():
    # barriers at 1, 3, 5, 7; worker 0 has its replies 0.5 s after each, worker 1 1.2 s after; each
    # computes 0.1 s (0.2 s in the warm-up round): replies take 1.2 s, the next pushes 0.8 s
    ends = [1.0, 3.0, 5.0, 7.0]
    w0 = {"t_start": [0.0, 1.5, 3.5, 5.5], "t_compute_end": [0.2, 1.6, 3.6, 5.6], "t_end": [1.5, 3.5, 5.5, 7.5]}
    w1 = {"t_start": [0.0, 2.2, 4.2, 6.2], "t_compute_end": [0.2, 2.3, 4.3, 6.3], "t_end": [2.2, 4.2, 6.2, 8.2]}
    phases = round_phases(ends, [w0, w1], warmup=1)
    assert phases == pytest.approx({"reply_s": 1.2, "push_s": 0.8, "compute_s": 0.1})
    with pytest.raises(ValueError, match="leave none"):
        round_phases(ends, [w0, w1], warmup=3)
    rows = [{"rate": "1gbit", "placement": "colocated", "round_s": 2.0, "bound_s": 1.0, **phases},
            {"rate": "1gbit", "placement": "ddp", "round_s": 2.0, "bound_s": 1.0, "reply_s": None}]
    lines = phase_lines(rows)
    assert len(lines) == 3 and lines[2].split() == ["1gbit", "colocated", "2.0000", "1.2000", "0.8000", "0.1000",
                                                    "0.5000"]


def test_model_bytes_from_the_shards():
    assert model_bytes([[0, 534400], [534400, 1068810]], 4) == M


def test_the_table_has_a_row_per_figure_and_dashes_where_nothing_was_counted():
    runs = [{"round_s": 1.0, "samples_per_second": 100.0, "link_bytes": 2.0e6, "wire_bytes": 2.1e6,
             "test_accuracy": 0.5},
            {"round_s": 2.0, "samples_per_second": 50.0, "link_bytes": 2.0e6, "wire_bytes": 2.1e6,
             "test_accuracy": 0.75},
            {"round_s": 0.5, "samples_per_second": 200.0, "link_bytes": 2.0e6, "wire_bytes": 2.1e6,
             "test_accuracy": 0.25}]
    row = summarize(runs, bound=0.5, expected_bytes=1.0e6)
    assert row["round_s"] == 1.0 and row["ratio"] == 0.5 and row["ratio_runs"] == [0.5, 0.25, 1.0]
    assert row["samples_per_second"] == 100.0 and row["link_bytes"] == 2.0e6
    ddp = summarize([{"round_s": 0.6, "samples_per_second": 80.0, "link_bytes": None, "wire_bytes": 1e6}], 0.5, 1e6)
    assert ddp["link_bytes"] is None
    rows = [{**row, "rate": "200mbit", "placement": "one", "formula": "WM/R", "reps": 3, "vs_ddp": 1.25},
            {**ddp, "rate": "200mbit", "placement": "ddp", "formula": "2M(W-1)/(WR)", "reps": 1, "vs_ddp": None}]
    lines = table_lines(rows)
    assert len(lines) == 4 and "bound/achieved" in lines[0]
    one, peer = lines[2].split(), lines[3].split()
    assert one[:6] == ["200mbit", "one", "3", "1.0000", "WM/R=0.500", "0.500"]
    assert one[6:] == ["0.250-1.000", "2.000", "2.000", "2.100", "100", "1.25", "0.5000"]  # the median accuracy
    assert peer[6:] == ["-", "-", "-", "1.000", "80", "-", "-"]


@pytest.mark.parametrize("options, says", [
    (["--rates", "200mbps"], "rate '200mbps'"),
    (["--placements", "colocated", "--workers", "1"], "placement colocated with 1 worker"),
    (["--rounds", "3", "--warmup", "2"], "leaves no round"),
    (["--set", "optim.lr=-1"], "optim.lr"),
])
def test_bad_options_are_refused_in_one_line_before_any_node_starts(options, says):
    p = subprocess.run([sys.executable, "-m", "ebsp_mpi", "bench", "cluster", *options], capture_output=True,
                       text=True, timeout=60, env=child_env())
    assert p.returncode == 2, p.stdout + p.stderr
    assert says in p.stderr and len(p.stderr.strip().splitlines()) == 1 and "Traceback" not in p.stderr
