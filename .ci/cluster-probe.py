"""What .ci/cluster-check.sh measures and asserts on the virtual cluster (.ci/cluster.sh), one
subcommand each. Every one prints one line and exits non-zero when its claim does not hold.

    bandwidth BYTES REPEATS        (under mpiexec, 2 ranks) rank 0 sends rank 1 BYTES, REPEATS times:
                                   prints the rate in Mbit/s
    oracle RUN ORACLE [TOL]        RUN's model equals ORACLE's within TOL (1e-5)
    placement RUN HOST,HOST,...    rank r of RUN ran on the r-th host named (its traces' host)
    clocks RUN STATE               every rank's recorded clock offset is its node's monotonic offset
                                   (STATE/nI.monotonic) less rank 0's node's, within 1 ms
    complete RUN W ITERATIONS K    RUN ended with ITERATIONS on each of its W workers, as its last
                                   checkpoint says, each traced once, its ranks on K nodes
    straggler RUN NODE             NODE's workers are RUN's stragglers: fewer iterations than any other
                                   worker, each (median) at least twice as long
    eager                          (under mpiexec) MPICH's eager shared-memory cells are set on each rank
                                   as its node's rank count allows (env.prepare_rank_env), and MPI starts
    devices RUN DEVICES            each worker of RUN used the fake GPU of its node-local rank (modulo
                                   DEVICES), each server the CPU
    accuracy RUN REF [TOL]         RUN's final test accuracy is REF's within TOL (0.01)
    causal RUN OUT                 on rank 0's time axis, no pull reply arrives before the server sent it
                                   and no push before the worker posted it; `timeline` (to OUT.json) puts
                                   every event within the run's span, and `report` reads the run
    gpubind DIR                    (a task of srun, after slurm/gpu-bind.sh) writes DIR/TASK.json: its
                                   node, Slurm ids, EBSP_SERVERS and CUDA_VISIBLE_DEVICES
    gpubound DIR GPUS              those files: each server saw no GPU, each worker one of GPUS (the
                                   list its node showed) by its local rank among the node's workers
    killed RUN NODE LOG            every process of NODE was killed under Hydra's mpiexec, which ended the
                                   job at once: LOG names NODE as lost (the enter launcher's line), and
                                   rank 0's set-up line there places on NODE exactly the ranks that ran
                                   there (their traces' host)
    checkpointed RUN               RUN's checkpoint reads whole, every part matching its checksum:
                                   prints its workers' most iterations
    cut RUN NODE LOG [any]         RUN ended after NODE's link was cut: LOG names every rank of NODE
                                   (by its rank number; with any, one of them at least)
    bench FILE [PLACEMENTS]        `bench cluster --json FILE` measured every placement named (comma-
                                   separated), each round at least as long as its bound (bound /
                                   achieved in (0, 1.05]), and its samples/s against DDP's above 0
"""

import json
import re
import sys
from pathlib import Path

import numpy as np


def bandwidth(nbytes: str, repeats: str) -> None:
    import time

    from mpi4py import MPI

    comm = MPI.COMM_WORLD
    buf = np.zeros(int(nbytes), dtype=np.uint8)
    comm.Barrier()
    t = time.perf_counter()
    for _ in range(int(repeats)):
        if comm.rank == 0:
            comm.Send(buf, dest=1)
        else:
            comm.Recv(buf, source=0)
    comm.Barrier()  # the last message is in when rank 1 enters the barrier
    seconds = time.perf_counter() - t
    if comm.rank == 0:
        print(f"{int(nbytes) * int(repeats) * 8 / seconds / 1e6:.1f}")


def max_abs_difference(a_dir: Path, b_dir: Path) -> float:
    from ebsp_mpi.outputs import read_model

    a, attrs_a = read_model(a_dir / "model.h5")
    b, attrs_b = read_model(b_dir / "model.h5")
    assert sorted(a) == sorted(b), f"tensors {sorted(a)} against {sorted(b)}"
    assert attrs_a["version"] == attrs_b["version"], f"version {attrs_a['version']} against {attrs_b['version']}"
    return max(float(np.abs(a[k] - b[k]).max()) for k in a)


def oracle(run: str, ref: str, tol: str = "1e-5") -> None:
    d = max_abs_difference(Path(run), Path(ref))
    assert d <= float(tol), f"{run}: the model differs from the oracle's by {d:.3g} > {tol}"
    print(f"{run}: max |model - oracle| = {d:.2g} <= {tol}")


def hosts_of(run: str) -> dict[int, str]:
    """Each rank's host, from its trace; read without locking, as the writer of a live file wants
    (after a cut, the cut node's ranks may still run, their traces open, until their abort's bound)."""
    from ebsp_mpi.trace import read_run

    return {rank: t.attrs["host"] for rank, t in read_run(run, live=True).items()}


def placement(run: str, hosts: str) -> None:
    want = hosts.split(",")
    got = hosts_of(run)
    assert [got.get(r) for r in range(len(want))] == want and len(got) == len(want), \
        f"{run}: ranks on {[got[r] for r in sorted(got)]}, not {want}"
    print(f"{run}: ranks 0..{len(want) - 1} on {','.join(want)}")


def clocks(run: str, state: str) -> None:
    from ebsp_mpi.trace import read_run

    traces = read_run(run)
    monotonic = {t.attrs["host"]: float(Path(state, f"{t.attrs['host']}.monotonic").read_text())
                 for t in traces.values()}
    zero = monotonic[traces[0].attrs["host"]]
    worst, seen = 0.0, {}
    for rank, t in sorted(traces.items()):
        host, recorded = t.attrs["host"], float(t.attrs["clock_offset_s"])
        expected = zero - monotonic[host]
        error = abs(recorded - expected)
        assert error <= 1e-3, (f"{run}: rank {rank} on {host} recorded a clock offset of {recorded:.6f} s, "
                               f"its node's is {expected:.6f} s (off by {error * 1e3:.3f} ms)")
        worst = max(worst, error)
        seen[host] = recorded
    assert len(set(monotonic.values())) == len(monotonic) > 1, f"{run}: the nodes' clocks {monotonic} not distinct"
    print(f"{run}: clock offsets to rank 0 " + ", ".join(f"{h} {o:+.3f} s" for h, o in sorted(seen.items()))
          + f"; worst error {worst * 1e6:.0f} us")


def cut(run: str, node: str, log: str, which: str = "all") -> None:
    ranks = sorted(r for r, h in hosts_of(run).items() if h == node)
    assert ranks, f"{run}: no rank on {node} in the traces"
    text = Path(log).read_text(errors="replace")
    named = [r for r in ranks if re.search(rf"\brank {r}\b", text)]
    if which == "all":
        assert named == ranks, f"{log}: names ranks {named} of {node}'s {ranks}:\n{text[-2000:]}"
    else:
        assert named, f"{log}: names none of {node}'s ranks {ranks}:\n{text[-2000:]}"
    print(f"{run}: the job's output names {node}'s rank(s) {', '.join(map(str, named))} of {ranks}")


def killed(run: str, node: str, log: str) -> None:
    ranks = sorted(r for r, h in hosts_of(run).items() if h == node)
    assert ranks, f"{run}: no rank on {node} in the traces"
    text = Path(log).read_text(errors="replace")
    lost = re.search(rf"^enter: node {node} lost: .*$", text, re.M)
    assert lost, f"{log}: does not name {node} as lost:\n{text[-2000:]}"
    setup = re.search(r"ranks: (.*)$", text, re.M)
    assert setup, f"{log}: no set-up line of the ranks' nodes"
    placed = sorted(int(r) for r, h in re.findall(r"(\d+) \([^)]*\) pid \d+ on (\S+?)(?:,|$)", setup[1]) if h == node)
    assert placed == ranks, f"{log}: the set-up line puts ranks {placed} on {node}, its traces {ranks}"
    print(f"{run}: {lost[0]!r}; the set-up line puts rank(s) {', '.join(map(str, ranks))} there")


def accuracy(run: str, ref: str, tol: str = "0.01") -> None:
    a, b = (json.loads(Path(d, "summary.json").read_text()) for d in (run, ref))
    assert a["sync"] == b["sync"], f"{run} ran {a['sync']}, {ref} {b['sync']}"
    d = abs(a["test_accuracy"] - b["test_accuracy"])
    assert d <= float(tol), (f"{run}: {a['sync']} across nodes reached a test accuracy of {a['test_accuracy']:.4f}, "
                             f"on one node {b['test_accuracy']:.4f} (off by {d:.4f} > {tol})")
    print(f"{run}: {a['sync']} test accuracy {a['test_accuracy']:.4f} across nodes, {b['test_accuracy']:.4f} on one")


def causal(run: str, out: str) -> None:
    import subprocess

    from ebsp_mpi.trace import read_run

    traces = read_run(run)
    server = traces[0]
    pulls, pushes = server.table("pulls"), server.table("pushes")
    servers = int(server.attrs["config"]["runtime"]["servers"])
    worst_pull, worst_push, checked = np.inf, np.inf, 0
    for rank, t in sorted(traces.items()):
        if t.role != "worker":
            continue
        w, its = rank - servers, np.sort(t.table("iterations"), order="iteration")
        p = np.sort(pulls[pulls["worker"] == w], order="t_request")
        assert len(p) == len(its) + 1, f"{run}: worker {w}: {len(p)} pulls answered for {len(its)} iterations"
        # pull 0 gives iteration 0's weights, pull j + 1 those that end iteration j
        received = np.concatenate([its["t_start"][:1], its["t_end"]])
        early = received - p["t_reply"]
        j = int(np.argmin(early))
        assert early[j] >= 0, (f"{run}: rank {rank} ({t.attrs['host']}) received pull {j} at {received[j]:.6f} s, "
                               f"{-early[j] * 1e3:.3f} ms before the server sent it ({p['t_reply'][j]:.6f} s)")
        q = pushes[pushes["worker"] == w]
        slack = q["t"] - its["t_push"][q["iteration"] - its["iteration"][0]]
        k = int(np.argmin(slack))
        assert slack[k] >= 0, (f"{run}: the server received rank {rank}'s push of iteration {q['iteration'][k]} "
                               f"{-slack[k] * 1e3:.3f} ms before {t.attrs['host']} posted it")
        worst_pull, worst_push = min(worst_pull, float(early.min())), min(worst_push, float(slack.min()))
        checked += len(p) + len(q)
    end = max(float(t.table("iterations")["t_end"].max()) for t in traces.values() if t.role == "worker")
    subprocess.run([sys.executable, "-m", "ebsp_mpi", "timeline", "-o", f"{out}.json", run], check=True,
                   capture_output=True)
    events = json.loads(Path(f"{out}.json").read_text())
    events = events["traceEvents"] if isinstance(events, dict) else events
    ts = [e["ts"] / 1e6 for e in events if "ts" in e and e.get("ph") != "M"]
    assert ts and min(ts) >= -1 and max(ts) <= end + 5, \
        f"{run}: the timeline spans {min(ts):.3f} .. {max(ts):.3f} s, the run 0 .. {end:.3f} s"
    report = subprocess.run([sys.executable, "-m", "ebsp_mpi", "report", "--out", f"{out}-report", run],
                            capture_output=True, text=True)
    assert report.returncode == 0, f"{run}: report exit {report.returncode}: {report.stderr[-500:]}"
    hosts = sorted({t.attrs["host"] for t in traces.values()})
    print(f"{run}: {checked} pulls and pushes across {','.join(hosts)} in causal order (closest: a reply "
          f"received {worst_pull * 1e6:.0f} us after it was sent, a push {worst_push * 1e6:.0f} us); "
          f"timeline {len(ts)} events within 0 .. {end:.2f} s; report reads it")


def gpubind(out: str) -> None:
    import os
    import socket

    env = os.environ
    task = {"host": socket.gethostname(), "cuda": env.get("CUDA_VISIBLE_DEVICES"),
            **{k: int(env[k]) for k in ("SLURM_PROCID", "SLURM_LOCALID", "SLURM_NODEID", "EBSP_SERVERS")}}
    Path(out, f"{task['SLURM_PROCID']}.json").write_text(json.dumps(task))


def gpubound(out: str, gpus: str) -> None:
    tasks = sorted((json.loads(f.read_text()) for f in Path(out).glob("*.json")), key=lambda t: t["SLURM_PROCID"])
    assert tasks, f"{out}: no task wrote its binding"
    shown, nodes = gpus.split(","), {}
    for t in tasks:
        rank, servers = t["SLURM_PROCID"], t["EBSP_SERVERS"]
        if rank < servers:
            assert t["cuda"] == "", f"rank {rank} (a server, on {t['host']}) sees GPUs {t['cuda']!r}"
            continue
        workers = nodes.setdefault(t["host"], [])  # the node's workers so far, by local id
        want = shown[len(workers) % len(shown)]
        assert t["cuda"] == want, (f"rank {rank} (worker, local id {t['SLURM_LOCALID']} on {t['host']}, worker "
                                   f"{len(workers)} there) sees GPU {t['cuda']!r}, not {want!r}")
        workers.append(t["cuda"])
    servers = [t["host"] for t in tasks if t["SLURM_PROCID"] < t["EBSP_SERVERS"]]
    print(f"{len(servers)} server(s) on {','.join(servers)} without GPUs; workers' GPUs "
          + ", ".join(f"{h}: {','.join(g)}" for h, g in nodes.items()))


def checkpointed(run: str) -> None:
    from ebsp_mpi.checkpoint import read_checkpoint

    ckpt = read_checkpoint(run)  # UsageError on a part that does not match its checksum
    done = [int(i) for i in ckpt.iterations]
    assert min(done) > 0, f"{run}: its last checkpoint counts iterations {done}"
    print(max(done))


def complete(run: str, workers: str, iterations: str, nodes: str) -> None:
    from ebsp_mpi.checkpoint import read_checkpoint
    from ebsp_mpi.trace import read_run

    workers_, n = int(workers), int(iterations)
    summary = json.loads(Path(run, "summary.json").read_text())
    done = [int(i) for i in read_checkpoint(run, arrays=False).iterations]
    assert done == summary["iterations"] == [n] * workers_, \
        f"{run}: the summary says {summary['iterations']}, the last checkpoint {done}, not {n} each"
    traces = read_run(run)
    assert sorted(traces) == list(range(workers_ + 1)), f"{run}: traces of ranks {sorted(traces)}"
    for rank in range(1, workers_ + 1):
        its = np.sort(traces[rank].table("iterations")["iteration"])
        assert np.array_equal(its, np.arange(n)), f"{run}: rank {rank}: {len(its)} iterations traced, not 0..{n - 1}"
    hosts = sorted({t.attrs["host"] for t in traces.values()})
    assert len(hosts) == int(nodes), f"{run}: ranks on {hosts}, not on {nodes} nodes"
    print(f"{run}: {n} iterations on each of {workers_} workers, every one traced once, ranks on {','.join(hosts)}")


def straggler(run: str, node: str) -> None:
    from ebsp_mpi.trace import read_run

    stats = {}
    for rank, t in sorted(read_run(run).items()):
        if t.role == "worker":
            its = t.table("iterations")
            stats[rank] = (t.attrs["host"], len(its), float(np.median(its["t_end"] - its["t_start"])))
    slow = [r for r, (h, _, _) in stats.items() if h == node]
    fast = [r for r in stats if r not in slow]
    assert slow and fast, f"{run}: workers on {node}: {slow}, elsewhere: {fast}"
    for r in slow:
        for f in fast:
            assert stats[r][2] >= 2 * stats[f][2] and stats[r][1] < stats[f][1], \
                f"{run}: rank {r} on {node} is no straggler beside rank {f}: {stats}"
    print(f"{run}: " + ", ".join(f"rank {r} on {h} {n} iterations of {m * 1e3:.1f} ms (median)"
                                 for r, (h, n, m) in stats.items()))


def eager() -> None:
    import os
    import socket

    from ebsp_mpi.runtime.transport.env import (MPICH_SHM_VARS, SHM_BYTES_PER_RANK, local_ranks, prepare_rank_env,
                                                shm_room)

    prepare_rank_env()  # as cli.main does, before MPI starts
    mine = (socket.gethostname(), local_ranks(), all(os.environ.get(k) == v for k, v in MPICH_SHM_VARS.items()),
            shm_room())
    from mpi4py import MPI  # MPI_Init, with the cells set or not

    ranks = MPI.COMM_WORLD.gather(mine, root=0)
    if MPI.COMM_WORLD.rank != 0:
        return
    per_node = {}
    for host, *_ in ranks:
        per_node[host] = per_node.get(host, 0) + 1
    room = min(r[3] for r in ranks)
    assert len(ranks) * SHM_BYTES_PER_RANK > room, f"the world's ranks fit {room / 2**20:.0f} MiB: no test"
    for rank, (host, local, cells, _) in enumerate(ranks):
        assert local == per_node[host], f"rank {rank} on {host} counts {local} ranks there, not {per_node[host]}"
        fits = local * SHM_BYTES_PER_RANK <= room
        assert cells == fits, f"rank {rank} on {host}: eager cells {'set' if cells else 'not set'} with {local} ranks"
    print(f"eager cells set on all {len(ranks)} ranks, {max(per_node.values())} a node, in room for "
          f"{room / 2**20:.0f} MiB (half of a node's /dev/shm; the world's {len(ranks)} would not fit)")


def devices(run: str, count: str) -> None:
    from ebsp_mpi.trace import read_run

    traces = read_run(run)
    seen: dict[str, int] = {}
    used = []
    for rank, t in sorted(traces.items()):
        host, device = t.attrs["host"], t.attrs["device"]
        local = seen.get(host, 0)  # Hydra numbers a node's ranks in order: its local ranks
        seen[host] = local + 1
        want = "cpu" if t.role == "server" else f"cupy:{local % int(count)} "
        assert device.startswith(want), f"{run}: rank {rank} ({t.role}, local rank {local} on {host}) on {device!r}"
        used.append(f"{rank}:{host}/{device.split()[0]}")
    print(f"{run}: devices by node-local rank: {', '.join(used)}")


def bench(path: str, placements: str = "") -> None:
    records = json.loads(Path(path).read_text())
    rounds = [r for r in records if r["reference"] == "link rate"]
    measured = {r["case"].split(", ")[2] for r in rounds}   # "small, 10mbit, colocated, 2 workers"
    missing = [p for p in placements.split(",") if p and p not in measured]
    assert rounds and not missing, f"{path}: no figure of {', '.join(missing) or 'any placement'}"
    for r in rounds:
        # the figure over the link's rate is bound / achieved: above 1 a round beat the physics
        assert 0 < r["ratio"] <= 1.05, f"{r['case']}: bound / achieved {r['ratio']:.3f}, outside (0, 1.05]"
    for r in records:
        assert r["figure"] > 0 and r["reference_figure"] > 0, f"{r['case']}: {r['figure']} against {r['reference']}"
    print("; ".join(f"{r['case']}: bound / achieved {r['ratio']:.3f}" for r in rounds))


if __name__ == "__main__":
    command, *args = sys.argv[1:]
    try:
        {"bandwidth": bandwidth, "oracle": oracle, "placement": placement, "clocks": clocks, "eager": eager,
         "devices": devices, "cut": cut, "complete": complete, "straggler": straggler,
         "accuracy": accuracy, "causal": causal, "gpubind": gpubind, "gpubound": gpubound,
         "checkpointed": checkpointed, "killed": killed, "bench": bench}[command](*args)
    except AssertionError as e:
        print(f"FAILED: {e}")
        sys.exit(1)
