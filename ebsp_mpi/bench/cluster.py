"""Benchmark: whole BSP training runs across the nodes of a virtual cluster, against the links' bound
and PyTorch DDP.

``python -m ebsp_mpi bench cluster`` (as root, no mpiexec: it launches the runs itself) brings up
the nodes it needs with ``.ci/cluster.sh`` of the checkout it runs from (under names of its own, see
``--cluster-state``), shapes every link to each ``--rates`` in turn (tc tbf, both ways), runs the job
in each placement (``bench/cluster_plan.py``) and PyTorch DDP (gloo, one process per node), alternately,
``--reps`` times each, and takes the cluster down at the end, on Ctrl-C and on failure too.

Per placement and rate it prints the seconds per round, the bound of the placement, their ratio
(bound / achieved: 1 is the physical limit) with its spread over the repetitions, the busiest link's
payload bytes per round against the bytes the bound counts, samples/s, and ours against DDP's at
that rate (``bench/cluster_figures.py`` says how each is taken).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import shlex
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from ..errors import UsageError
from ..helptext import plain
from ..safe_text import integer, number
from .cluster_figures import (barrier_times, busiest_link, link_bytes, median_round, model_bytes, phase_lines,
                              round_phases, summarize, table_lines)
from .cluster_plan import Placement, placement, rate_bytes
from .report import record

MODELS = {
    # the MLP 784-1024-256-10 (1,068,810 parameters, M = 4.28 MB): bandwidth-bound
    "large": ["data.name=synthetic", "data.synthetic_features=784", "data.synthetic_samples=10000",
              "model.hidden=[1024,256]", "data.batch_size=32"],
    # the digits MLP 64-128-64-10 (17,226 parameters, M = 69 kB): a link of a few Mbit/s binds it
    "small": ["model.hidden=[128,64]", "data.batch_size=32"],
    # Poseidon's case, an MLP 4096-4096-10 (16,822,282 parameters, M = 67 MB) on synthetic data: its
    # 4096 x 4096 layer's gradient is 64 MB, its sufficient factors at batch 32 are 1 MB (comm.hybrid).
    # At the default lr of 0.05 it diverged (test loss 74 after 70 rounds) and a worker's compute grew
    # with it, up to 20-fold (docs/cluster.md): a comparison with DDP would measure the divergence
    "wide": ["data.name=synthetic", "data.synthetic_features=4096", "data.synthetic_samples=4096",
             "model.hidden=[4096]", "data.batch_size=32", "optim.lr=0.005"],
}
COMMON = ["sync.model=bsp", "stop.epochs=0", "straggler.enabled=false", "eval.every_seconds=1e9"]
DDP_PORT = 29500   # gloo's rendezvous on node 1; each DDP run takes the next port (no TIME_WAIT clash)
#: the cluster's names unless given: none of .ci/cluster.sh's defaults nor the check's
NAMES = {"state": "/run/ebsp-bench-cluster", "bridge": "ebspbn0", "prefix": "ebbn", "subnet": "10.213.12"}


class Stopped(Exception):
    """SIGTERM or SIGHUP: end as Ctrl-C does, taking the cluster down."""


def _stop(signum, frame):
    raise Stopped(signal.Signals(signum).name)


class Cluster:
    """The virtual cluster this benchmark brought up: its names, and the commands of ``.ci/cluster.sh``."""

    def __init__(self, script: Path, names: dict):
        self.script, self.names = script, names
        self.env = {**os.environ, "CLUSTER_STATE": names["state"], "CLUSTER_BRIDGE": names["bridge"],
                    "CLUSTER_PREFIX": names["prefix"], "CLUSTER_SUBNET": names["subnet"]}
        self.enter = str(Path(names["state"]) / "enter")
        self.nodes = 0

    def _sh(self, *args: str) -> None:
        p = subprocess.run(["bash", str(self.script), *args], env=self.env, capture_output=True, text=True)
        if p.returncode != 0:
            raise UsageError(f"bench cluster: cluster.sh {' '.join(args)} failed: "
                             f"{(p.stderr.strip().splitlines() or ['(no message)'])[-1]}")

    def up(self, nodes: int, rate: str) -> None:
        self._sh("up", str(nodes), "--rate", rate)
        self.nodes = nodes

    def shape(self, rate: str) -> None:
        for i in range(self.nodes):
            self._sh("shape", f"n{i + 1}", rate)

    def down(self) -> None:
        subprocess.run(["bash", str(self.script), "down"], env=self.env, capture_output=True)

    def counters(self) -> dict[str, tuple[int, int]]:
        """Per node, the bytes its link has carried out and in so far, on the wire (the host's end of
        its veth: what it receives the node sent)."""
        out = {}
        for i in range(self.nodes):
            stats = Path("/sys/class/net") / f"{self.names['prefix']}-n{i + 1}" / "statistics"
            out[f"n{i + 1}"] = (int((stats / "rx_bytes").read_text()), int((stats / "tx_bytes").read_text()))
        return out

    def address(self, node: str) -> str:
        return (Path(self.names["state"]) / f"{node}.addr").read_text().strip()


def _env() -> dict:
    from ..runtime.transport.env import cap_blas_threads

    return cap_blas_threads(dict(os.environ))


def _wait(procs: list[subprocess.Popen], timeout: float, who: str) -> None:
    """Wait for every process of one run; kill them all (each its own session) on timeout or failure."""
    deadline = time.monotonic() + timeout
    try:
        for p in procs:
            try:
                p.wait(timeout=max(deadline - time.monotonic(), 0.1))
            except subprocess.TimeoutExpired:
                raise UsageError(f"bench cluster: {who} did not finish within --timeout {timeout:g} s; "
                                 "give it longer") from None
            if p.returncode != 0:
                err = p.stderr.read() if p.stderr else ""
                raise RuntimeError(f"{who} exited {p.returncode}: {err.strip()[-1500:]}")
    finally:
        for p in procs:
            if p.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(p.pid, signal.SIGKILL)
                p.wait()


def run_ours(cluster: Cluster, where: Placement, overrides: list[str], out: Path, args) -> dict:
    """One BSP run under Hydra across the placement's nodes; its figures (``cluster_figures``)."""
    from ..runtime.transport.env import find_mpiexec
    from ..trace import read_run

    sets = [a for o in overrides + [f"runtime.servers={where.servers}"] for a in ("--set", o)]
    cmd = [*find_mpiexec(args.mpiexec), "-iface", cluster.names["bridge"], "-launcher", "ssh",
           "-launcher-exec", cluster.enter, "-hosts", where.hydra_hosts(), "-n", str(len(where.hosts)),
           sys.executable, "-m", "ebsp_mpi", "train", "-q", "--out", str(out), *sets]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=_env(),
                            start_new_session=True)
    _wait([proc], args.timeout, f"the run in placement {where.name}")
    summary = json.loads((out / "summary.json").read_text())
    traces = read_run(out)
    ranks = []
    for r, t in sorted(traces.items()):
        if t.attrs["host"] != where.hosts[r]:   # a figure of another placement would be silently wrong
            raise RuntimeError(f"placement {where.name}: rank {r} ran on {t.attrs['host']}, not {where.hosts[r]}")
        counts = t.attrs["bytes"]["total"]
        ranks.append({"host": t.attrs["host"], "role": t.attrs["role"],
                      "sent": sum(c["sent"] for c in counts.values()),
                      "received": sum(c["received"] for c in counts.values())})
    pushes = traces[0].table("pushes")
    ends = barrier_times(pushes["iteration"], pushes["t"])
    rounds = min(summary["iterations"])
    return {"round_s": median_round(ends, args.warmup), "test_accuracy": summary["test_accuracy"],
            **round_phases(ends, [t.table("iterations") for t in traces.values() if t.attrs["role"] == "worker"],
                           args.warmup),
            "samples_per_second": summary["samples_per_second"],
            "link_bytes": busiest_link(link_bytes(ranks, where.workers)) / rounds,
            "rounds": rounds,
            "model_bytes": model_bytes(traces[0].attrs["shards"], traces[0].attrs["hybrid"]["float_bytes"]),
            "shard_bytes": max(model_bytes([s], traces[0].attrs["hybrid"]["float_bytes"])
                               for s in traces[0].attrs["shards"])}


def run_ddp(cluster: Cluster, where: Placement, overrides: list[str], out: Path, port: int, args) -> dict:
    """One PyTorch DDP run, a process on each of the placement's nodes; its figures."""
    result = out / "ddp.json"
    out.mkdir(parents=True)
    init = f"tcp://{cluster.address(where.hosts[0])}:{port}"
    env = {**_env(), "GLOO_SOCKET_IFNAME": "eth0"}   # every node's link is its eth0
    procs = []
    for rank, host in enumerate(where.hosts):
        cmd = [sys.executable, "-m", "ebsp_mpi.bench.ddp", "--workers", str(where.workers), "--rank", str(rank),
               "--init", init, "--result", str(result), *[a for o in overrides for a in ("--set", o)]]
        procs.append(subprocess.Popen([cluster.enter, host, shlex.join(cmd)], stdout=subprocess.DEVNULL,
                                      stderr=subprocess.PIPE, text=True, env=env, start_new_session=True))
    _wait(procs, args.timeout, "the DDP run")
    found = json.loads(result.read_text())
    return {"round_s": median_round([0.0, *found["step_ends"]], args.warmup),
            "test_accuracy": found["test_accuracy"],
            "samples_per_second": found["samples_per_second"], "link_bytes": None,
            "rounds": len(found["step_ends"])}


def torch_missing() -> str:
    try:
        import torch  # noqa: F401
    except ImportError:
        return "torch does not import (pip install torch)"
    return ""


def measure(cluster: Cluster, places: list[Placement], args, overrides: list[str], runs_dir: Path) -> list[dict]:
    """Every rate, every repetition, every placement in turn; the table's rows."""
    rows, port = [], DDP_PORT
    for i, rate in enumerate(args.rates):
        if i:
            cluster.shape(rate)
        figures: dict[str, list[dict]] = {p.name: [] for p in places}
        for rep in range(args.reps):
            for p in places:   # alternately: a change of load on the machine hits each alike
                out = runs_dir / f"{rate}-{p.name}-{rep}"
                before = cluster.counters()
                if p.is_ddp:
                    port += 1
                    found = run_ddp(cluster, p, overrides, out, port, args)
                else:
                    found = run_ours(cluster, p, overrides, out, args)
                after = cluster.counters()
                found["wire_bytes"] = busiest_link({n: (after[n][0] - before[n][0], after[n][1] - before[n][1])
                                                    for n in after}) / found["rounds"]
                figures[p.name].append(found)
            print(f"  {rate} rep {rep + 1}/{args.reps}: " + ", ".join(
                f"{name} {f[-1]['round_s']:.4f} s/round" for name, f in figures.items()), flush=True)
        m = [f["model_bytes"] for fs in figures.values() for f in fs if "model_bytes" in f]
        if len(set(m)) != 1:
            raise RuntimeError(f"the runs' models differ in size: {sorted(set(m))} bytes")
        rate_b = rate_bytes(rate)
        ddp = figures.get("ddp")
        ddp_sps = statistics.median(f["samples_per_second"] for f in ddp) if ddp else None
        for p in places:
            shard = None if p.is_ddp else figures[p.name][0]["shard_bytes"]
            bound = p.bound_seconds(m[0], rate_b, shard)
            row = summarize(figures[p.name], bound, bound * rate_b)
            row.update(rate=rate, placement=p.name, formula=p.formula(), reps=args.reps, model_bytes=m[0],
                       workers=p.workers, servers=p.servers, nodes=p.nodes,
                       vs_ddp=row["samples_per_second"] / ddp_sps if ddp_sps and not p.is_ddp else None)
            rows.append(row)
    return rows


def records_of(rows: list[dict], model: str) -> list[dict]:
    """``--json``: per row, the bandwidth the round achieved (the bound's bytes / seconds per round)
    against the link's rate (the ratio is bound / achieved); per placement of ours, samples/s against DDP's."""
    out = []
    for r in rows:
        case = f"{model}, {r['rate']}, {r['placement']}, {r['workers']} workers"
        out.append(record("cluster", case, r["expected_bytes"] / r["round_s"], "B/s", "link rate",
                          r["expected_bytes"] / r["bound_s"]))
        if r["vs_ddp"] is not None:
            out.append(record("cluster", case, r["samples_per_second"], "samples/s", "PyTorch DDP (gloo)",
                              r["samples_per_second"] / r["vs_ddp"]))
    return out


def parse(argv) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m ebsp_mpi bench cluster",
                                     description=plain(__doc__.split("\n\n")[0]))
    parser.add_argument("--rates", default="200mbit,1gbit", help="comma-separated tc rates of every link")
    parser.add_argument("--placements", default="one,spread2,spread4,colocated,ddp",
                        help="comma-separated: one (1 server alone), spreadK (K servers alone), "
                             "colocated (a server beside each worker), ddp (PyTorch DDP)")
    parser.add_argument("--model", choices=list(MODELS), default="large",
                        help="large: MLP 784-1024-256-10 on synthetic data; small: the digits MLP; wide: MLP "
                             "4096-4096-10 on synthetic data (with --set comm.hybrid=sfb: Poseidon's case)")
    parser.add_argument("--workers", type=integer, default=4)
    parser.add_argument("--rounds", type=integer, default=30, help="BSP rounds (stop.iterations) of each run")
    parser.add_argument("--warmup", type=integer, default=2, help="first rounds of each run left out of its median")
    parser.add_argument("--reps", type=integer, default=3, help="runs of each placement, alternately (median)")
    parser.add_argument("--nodes", type=integer, default=0, help="nodes to bring up (default: as the placements need)")
    parser.add_argument("--timeout", type=number, default=300.0, help="seconds one run may take")
    parser.add_argument("--mpiexec", help="Hydra's mpiexec (default: the one beside this Python)")
    parser.add_argument("--runs", help="keep every run's directory under RUNS (default: a temporary one)")
    parser.add_argument("--set", dest="set", action="append", default=[], metavar="KEY=VALUE",
                        help="override a key of every run's job")
    for key, default in NAMES.items():
        parser.add_argument(f"--cluster-{key}", default=default,
                            help=f"the cluster's CLUSTER_{key.upper()} ({default})")
    args = parser.parse_args(argv)
    args.rates = [r.strip() for r in args.rates.split(",") if r.strip()]
    args.placements = [p.strip() for p in args.placements.split(",") if p.strip()]
    if min(args.workers, args.rounds, args.reps) < 1 or args.warmup < 0 or not args.rates or not args.placements:
        raise UsageError("bench cluster: --workers, --rounds, --reps at least 1, --warmup at least 0, "
                         "and at least one rate and one placement")
    if args.rounds - 1 <= args.warmup:
        raise UsageError(f"bench cluster: --rounds {args.rounds} leaves no round after --warmup {args.warmup}")
    if not (args.timeout > 0 and math.isfinite(args.timeout)):
        raise UsageError(f"bench cluster: --timeout {args.timeout:g}: must be a number of seconds above 0")
    return args


def main(argv=None, records: list | None = None) -> int:
    args = parse(argv)
    for rate in args.rates:
        rate_bytes(rate)   # one line for a bad rate, before anything starts
    places = [placement(name, args.workers) for name in args.placements]
    overrides = MODELS[args.model] + COMMON + [f"stop.iterations={args.rounds}"] + args.set
    from ..config import load_job

    load_job(None, overrides)   # a bad --set is one line, before anything runs
    missing = torch_missing() if any(p.is_ddp for p in places) else ""
    if missing:
        print(f"PyTorch DDP left out: {missing}")
        places = [p for p in places if not p.is_ddp]
        if not places:
            raise UsageError("bench cluster: nothing left to run without PyTorch")
    nodes = args.nodes or max(p.nodes for p in places)
    if nodes < max(p.nodes for p in places):
        raise UsageError(f"bench cluster: --nodes {nodes}: the placements need {max(p.nodes for p in places)}")
    script = Path(__file__).resolve().parents[2] / ".ci" / "cluster.sh"
    if not script.is_file():
        raise UsageError(f"bench cluster: no {script}: run it from a checkout of the repository")
    if os.geteuid() != 0:
        raise UsageError("bench cluster: needs root (.ci/cluster.sh makes namespaces, veths and tc qdiscs)")
    cluster = Cluster(script, {k: getattr(args, f"cluster_{k}") for k in NAMES})
    start = time.monotonic()
    handlers = {s: signal.signal(s, _stop) for s in (signal.SIGTERM, signal.SIGHUP)}
    try:
        with contextlib.ExitStack() as stack:
            runs_dir = Path(args.runs) if args.runs else Path(stack.enter_context(
                tempfile.TemporaryDirectory(prefix="ebsp-bench-cluster-")))
            runs_dir.mkdir(parents=True, exist_ok=True)
            runs_dir.chmod(0o755)
            cluster.up(nodes, args.rates[0])   # an up that fails takes down what it made
            stack.callback(cluster.down)
            print(f"{nodes} nodes up ({args.cluster_state}); {args.model} model, BSP, {args.workers} workers, "
                  f"{args.rounds} rounds, {args.reps} reps", flush=True)
            rows = measure(cluster, places, args, overrides, runs_dir)
    except RuntimeError as e:
        print(f"bench cluster: {e}", file=sys.stderr)
        return 1
    except (Stopped, KeyboardInterrupt) as e:
        print(f"bench cluster: stopped by {str(e) or 'Ctrl-C'}; every run and the cluster ended", file=sys.stderr)
        return 130 if isinstance(e, KeyboardInterrupt) else 1
    finally:
        for s, h in handlers.items():
            signal.signal(s, h)
    print(f"\nBSP across nodes against the links' bound (M = {rows[0]['model_bytes']:,} bytes; s/round: median "
          f"after {args.warmup} warm-up rounds; ratio: bound / achieved; link MB/round: the busiest link, one way, "
          f"payload; {time.monotonic() - start:.0f} s in all)")
    print("\n".join(table_lines(rows)))
    print("\nwhere a round of ours goes (medians, s): the barrier to every reply in, then to every push of the "
          "next round in; a worker's forward and backward pass")
    print("\n".join(phase_lines(rows)))
    print("every run, s/round: " + "; ".join(
        f"{r['rate']} {r['placement']} " + "/".join(f"{v:.4f}" for v in r["round_s_runs"]) for r in rows))
    if records is not None:
        records += records_of(rows, args.model)
    return 0
