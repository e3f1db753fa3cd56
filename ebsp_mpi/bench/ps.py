"""Benchmark: the push + pull round trip through the parameter server against raw MPI moving the same
bytes, and the server's update against a NumPy in-place axpy.

``mpiexec -n N python -m ebsp_mpi bench ps``. For each parameter count P (default 1e4 ... 1e7 float32)
and each number k of workers at once (default 1 ... N-1; the other ranks sleep in a barrier):

- **round trip** through the real runtime: ``runtime.servers.server.Server`` and ``runtime.worker.Worker`` on
  ranks 0..k, a job whose model (an MLP on synthetic data, one hidden layer) has about P parameters,
  and workers whose :meth:`~ebsp_mpi.runtime.worker.loop.Worker.compute_gradient` returns at once, so that
  an iteration is the push (chunks + header, persistent requests; on one node the server reads the
  gradient in place and only the header is a message, ``runtime.shared_pushes``, which ``--set
  runtime.shared_pushes=false`` turns off), the server's work (arrival with ``Testsome``, the sync
  policy, the momentum SGD update; under BSP the reply goes out from the parameters, under the other
  models from a snapshot of them) and the pull reply.
  Figure: bytes moved per second, ``k * 2 * 4P`` per iteration over the median iteration time seen
  by the workers.
- **raw MPI**, the reference, on the same ranks in the same run: each worker sends the same chunks and
  header (``Isend``) and receives the same reply (``Irecv``), rank 0 receives every worker's push and
  answers each, all with blocking ``Waitall`` and nothing computed. Measured before and after the
  runtime's round trip; the median of both.
- **the server's work in raw MPI**, the runtime's ceiling: the same raw exchange, with rank 0 doing
  what the server does between a push and its reply under BSP (:class:`ServerWork`: the workers'
  mean, the momentum step chunk by chunk, each chunk sent once updated), each worker the NaN/Inf check
  of its gradient before it sends, and nothing else: no polling loop, no sync policy, no trace. Its
  ratio to raw MPI is what the work itself costs on this machine; the runtime's ratio to it is what
  the runtime adds.
- **update**: the per-push work on a P-element gradient (``nn.kernels.all_finite``, the worker's, and
  the job's ``SGD.step``, the server's; momentum 0.9) in bytes of gradient per second, against
  ``y += a * x`` in place on the same sizes (``multiply(x, a, out=t); add(y, t, out=y)``), timed
  alternately on rank 0. Also shown: the same work done with NumPy passes instead of the fused loops,
  and the fused work against a compiled one-pass axpy, which moves 3 arrays' worth of bytes where
  momentum SGD must move 5.
"""

from __future__ import annotations

import argparse
import functools
import logging
import time

import numpy as np

from ..errors import UsageError
from ..sync.registry import POLICIES
from .ranks import abort_on_failure, idle_barrier, require_ranks, subgroup, world
from .report import alternate, human, parse_sizes, print_table, record
from .runjob import breakdown, run_job
from ..safe_text import integer

SIZES = "1e4,1e5,1e6,1e7"
#: the synthetic model: FEATURES inputs, one hidden layer, CLASSES outputs, so
#: P = hidden * (FEATURES + 1 + CLASSES) + CLASSES parameters
FEATURES, CLASSES = 89, 10
#: the raw exchange's header tags; its chunks use the chunks' own tags, as the runtime does
RAW_PUSH_TAG, RAW_PULL_TAG = 1000, 1001
#: the round trip's target against raw MPI, from TARGET_MIN_BYTES up; the update's against NumPy's axpy
TARGET, UPDATE_TARGET = (">=", 0.75), (">=", 0.7)
TARGET_MIN_BYTES = 1 << 20


def hidden_for(params: int) -> int:
    """Hidden width whose MLP (FEATURES -> hidden -> CLASSES) has closest to `params` parameters."""
    return max(1, round((params - CLASSES) / (FEATURES + 1 + CLASSES)))


def job_for(params: int, iterations: int, sync: str, trace: bool, overrides: list[str] = ()):
    """A job for the runtime whose model has about `params` float32 parameters; no evaluation, no
    stragglers, batch 1 (the benchmark's workers compute nothing anyway); then `overrides`."""
    from ..config import load_job

    return load_job(None, [
        "data.name=synthetic", f"data.synthetic_features={FEATURES}", f"data.synthetic_classes={CLASSES}",
        "data.synthetic_samples=200", "data.batch_size=1", "model.kind=mlp",
        f"model.hidden=[{hidden_for(params)}]", f"stop.iterations={iterations}", "stop.epochs=0",
        "eval.every_seconds=1e9", "straggler.enabled=false", f"trace.enabled={str(trace).lower()}",
        f"sync.model={sync}", *overrides])


def chunks_of(job, ctx) -> tuple[int, list]:
    """The parameter count of `job`'s model and the messages a push of it is split into (as the runtime
    on `ctx` splits it)."""
    from mpi4py import MPI

    from .. import build
    from ..runtime.transport.protocol import plan_chunks

    space = build.model(job, build.dataset(job)).space
    bounds = [(t.offset, t.size) for t in space.tensors]
    return space.size, plan_chunks(bounds, 4, ctx.chunk_bytes(job.runtime.chunk_bytes),
                                   MPI.COMM_WORLD.Get_attr(MPI.TAG_UB))


# -- raw MPI ------------------------------------------------------------------------------------------

class ServerWork:
    """The server's work on a BSP round, done the way ``runtime.servers.server.Server`` does it, for the raw
    MPI exchange: per chunk the mean of the workers' gradients (summed in worker order) and the job's
    optimizer step (momentum SGD). The NaN/Inf check is the workers' (:func:`_raw_worker`)."""

    def __init__(self, job, size: int, workers: int):
        from .. import build

        self.opt = build.optimizer(job, size)
        self.lr = float(job.optim.lr)
        self.mean = np.empty(size, dtype=np.float32) if workers > 1 else None

    def step(self, grads: list[np.ndarray], params: np.ndarray, c) -> None:
        piece = slice(c.start, c.stop)
        self.opt.step_mean(params[piece], [g[piece] for g in grads], self.lr, offset=c.start,
                           out=None if self.mean is None else self.mean[piece])


def raw_round_trips(comm, size: int, chunks: list, iterations: int, work: ServerWork | None = None,
                    servers: int = 1, owner: list[int] | None = None) -> list[float]:
    """Push + pull of `size` float32 in `chunks` between the workers (ranks `servers`..) and the
    servers (ranks 0..`servers`-1) with plain MPI: each chunk to and from its `owner` (default rank 0),
    the header to every server, the reply's header from rank 0, as the runtime does.

    A server keeps the next push's receives posted before it answers (as the runtime's do), so every
    message meets a posted receive. With `work` (one server), rank 0 also does the server's work
    between the push and the reply: it updates the parameters chunk by chunk and sends each chunk as
    soon as it is updated, as a BSP round does at its close (``runtime.servers.round_stream``), and each
    worker checks its gradient for NaN and Inf before it sends, as ``DenseWire.push_rest`` does.
    Returns each iteration's seconds on a worker, nothing on a server.

    Every buffer holds data, as the runtime's do (its workers push a gradient of 1e-3). A buffer that is
    allocated zeroed and never written is backed by the kernel's one shared zero page, and a copy from
    it reads the same 4 KiB over and over from cache: at 1e7 parameters that made the raw round trip
    5.7 instead of 8.3 ms.
    """
    owner = owner or [0] * len(chunks)
    if comm.Get_rank() < servers:
        _raw_server(comm, size, chunks, iterations, work, servers, owner)
        return []
    return _raw_worker(comm, size, chunks, iterations, servers, owner, check=work is not None)


def _raw_server(comm, size: int, chunks: list, iterations: int, work: ServerWork | None, servers: int,
                owner: list[int]) -> None:
    """A server's side of :func:`raw_round_trips`: its chunks of every worker's push in, the reply out."""
    from mpi4py import MPI

    from ..runtime.transport.protocol import PULL_FIELDS, PUSH_FIELDS, header

    rank, n = comm.Get_rank(), comm.Get_size() - servers
    mine = [c for k, c in enumerate(chunks) if owner[k] == rank]
    grads = [_filled(size) for _ in range(n)]
    heads = [header(PUSH_FIELDS) for _ in range(n)]
    params, reply = _filled(size), header(PULL_FIELDS)

    def post():
        reqs = []
        for w in range(n):
            reqs += [comm.Irecv([grads[w][c.start:c.stop], MPI.FLOAT], servers + w, c.tag) for c in mine]
            reqs.append(comm.Irecv([heads[w], MPI.DOUBLE], servers + w, RAW_PUSH_TAG))
        return reqs

    recvs = post()
    for i in range(iterations):
        MPI.Request.Waitall(recvs)
        recvs = post() if i + 1 < iterations else []
        sends = [comm.Isend([reply, MPI.DOUBLE], servers + w, RAW_PULL_TAG) for w in range(n)] if rank == 0 else []
        for c in mine:
            if work is not None:
                work.step(grads, params, c)
            sends += [comm.Isend([params[c.start:c.stop], MPI.FLOAT], servers + w, c.tag) for w in range(n)]
        MPI.Request.Waitall(sends)


def _raw_worker(comm, size: int, chunks: list, iterations: int, servers: int, owner: list[int],
                check: bool = False) -> list[float]:
    """A worker's side of :func:`raw_round_trips`: each iteration's seconds, push sent to reply received
    (with `check`, the NaN/Inf check of the gradient first, in the time)."""
    from mpi4py import MPI

    from ..nn.kernels import all_finite
    from ..runtime.transport.protocol import PULL_FIELDS, PUSH_FIELDS, header

    grad, params = _filled(size), _filled(size)
    head, reply = header(PUSH_FIELDS), header(PULL_FIELDS)
    times = []
    for _ in range(iterations):
        t = time.perf_counter()
        if check:
            head[-1] = float(all_finite(grad))  # the header's last field: the verdict
        reqs = [comm.Irecv([reply, MPI.DOUBLE], 0, RAW_PULL_TAG)]
        reqs += [comm.Irecv([params[c.start:c.stop], MPI.FLOAT], owner[k], c.tag) for k, c in enumerate(chunks)]
        reqs += [comm.Isend([grad[c.start:c.stop], MPI.FLOAT], owner[k], c.tag) for k, c in enumerate(chunks)]
        reqs += [comm.Isend([head, MPI.DOUBLE], s, RAW_PUSH_TAG) for s in range(servers)]
        MPI.Request.Waitall(reqs)
        times.append(time.perf_counter() - t)
    return times


def _filled(size: int) -> np.ndarray:
    """`size` float32 of 1e-3 (the benchmark workers' gradient), every page written."""
    return np.full(size, 1e-3, dtype=np.float32)


# -- the runtime --------------------------------------------------------------------------------------

def _timed_worker_class():
    from ..runtime.worker.loop import Worker

    class TimedWorker(Worker):
        """A worker whose gradient takes no time: its iterations are the push and the pull alone."""

        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            self.starts: list[float] = []
            self.model.space.grad[...] = 1e-3  # finite, so the server applies every push

        def compute_gradient(self) -> float:
            self.starts.append(time.perf_counter())
            return 0.0

    return TimedWorker


def core_timers():
    """A ``ServerProbe`` that times what the server's core does in each BSP round: taking push messages
    (the polls that find some: MPI's copy of the chunks, which the receiving process does) and carrying
    out the round's order (the chunked step and the sends of the streamed reply). Its ``rounds`` gets
    one ``(receive seconds, step + reply seconds, start of the step)`` per round."""
    from ..runtime.servers.probe import ServerProbe

    class CoreTimers(ServerProbe):
        def __init__(self):
            self.rounds: list[tuple[float, float, float]] = []
            self.receive, self.serve_t0, self.resume_t, self.round_t0 = 0.0, None, None, 0.0

        def serving(self) -> None:
            self.serve_t0, self.resume_t = time.perf_counter(), None

        def served(self, found: bool) -> None:
            if found:  # the part of this poll outside a round it applied
                self.receive += time.perf_counter() - (self.resume_t or self.serve_t0)
            self.serve_t0 = None

        def round_begins(self) -> None:
            self.round_t0 = time.perf_counter()

        def round_ends(self, closed: bool) -> None:
            if not closed:  # a server of one shard waits for a push still to come (rank 0 never does)
                return
            t, done = self.round_t0, time.perf_counter()
            # a round applied while taking a push counts that poll's time up to here as receiving
            self.rounds.append((self.receive + t - (self.serve_t0 or t), done - t, t))
            self.receive, self.resume_t = 0.0, done

    return CoreTimers()


def runtime_round_trips(ctx, job, warmup: int) -> tuple[list[list[float]], dict | None, dict | None]:
    """Run `job` through the real server (rank 0 of `ctx`) and workers that compute nothing.

    Returns, on rank 0, every worker's iteration seconds, the :func:`~ebsp_mpi.bench.runjob.breakdown`
    of worker 0's iterations after `warmup` when the job writes traces, and the medians of
    :func:`core_timers` per round after `warmup` when the server ran rounds (BSP); elsewhere nothing.
    """
    read = (lambda run_dir: breakdown(run_dir, warmup)) if job.trace.enabled else None
    timers = core_timers()
    result = run_job(ctx, job, _timed_worker_class(), read=read, probe=timers)
    rounds = timers.rounds
    periods = ctx.comm.gather(None if ctx.rank < ctx.servers else list(np.diff(result.starts)), root=0)
    if ctx.rank != 0:
        return [], None, None
    core = None
    if len(rounds) > warmup + 1:
        receive, step, starts = (np.array(column) for column in zip(*rounds[warmup:], strict=True))
        core = {"receive": float(np.median(receive)), "step + reply sends": float(np.median(step)),
                "round": float(np.median(np.diff(starts)))}
    return periods[ctx.servers:], (result[1] if read is not None else None), core


def round_trip_case(world_comm, params: int, k: int, args) -> tuple[list[dict], list[dict], dict, dict, dict]:
    """Ranks 0..k, for `params` parameters: raw MPI, raw MPI with the server's work, the runtime, and
    the two raw exchanges again, in reverse order.

    Returns, on rank 0, the record, the record of the server's work in raw MPI against raw MPI, the
    first record's target where the buffer has at least 1 MiB, the breakdown of the runtime's
    iterations and the server core's time per round, by case (elsewhere nothing).
    """
    from ..runtime.rank.start import setup

    sub = subgroup(world_comm, k + 1)
    found: list[dict] = []
    ceiling: list[dict] = []
    targets: dict = {}
    parts: dict = {}
    cores: dict = {}
    if sub is not None:
        ctx = setup(sub)
        job = job_for(params, args.warmup + args.iterations, args.sync, not args.no_trace, args.set)
        size, chunks = chunks_of(job, ctx) if ctx.rank == 0 else (None, None)
        size, chunks = ctx.comm.bcast((size, chunks), root=0)
        total = args.warmup + args.iterations
        work = ServerWork(job, size, k) if ctx.rank == 0 else None
        raw = raw_round_trips(ctx.comm, size, chunks, total)[args.warmup:]
        worked = raw_round_trips(ctx.comm, size, chunks, total, work)[args.warmup:]
        ours, split, core = runtime_round_trips(ctx, job, args.warmup)
        worked += raw_round_trips(ctx.comm, size, chunks, total, work)[args.warmup:]
        raw += raw_round_trips(ctx.comm, size, chunks, total)[args.warmup:]
        raw, worked = ctx.comm.gather(raw, root=0), ctx.comm.gather(worked, root=0)
        if ctx.rank == 0:
            # the first iterations include the first pull and page faults: drop each worker's warm-up
            ours_med = float(np.median([t for times in ours for t in times[args.warmup:]]))
            raw_med = float(np.median([t for times in raw for t in times]))
            worked_med = float(np.median([t for times in worked for t in times]))
            moved = k * 2 * 4 * size
            name = f"{size:,} params ({4 * size / 2**20:.2f} MiB), {k} worker(s)"
            found.append(record("ps", f"round trip {name}", moved / ours_med, "B/s", "raw MPI, same messages",
                                moved / raw_med))
            ceiling.append(record("ps", f"server's work in raw MPI {name}", moved / worked_med, "B/s",
                                  "raw MPI, same messages", moved / raw_med))
            if 4 * size >= TARGET_MIN_BYTES:
                targets[found[-1]["case"]] = TARGET
            if split:
                parts[found[-1]["case"]] = split
            if core:
                cores[found[-1]["case"]] = core
        ctx.comm.Free()
        sub.Free()
    idle_barrier(world_comm)
    return found, ceiling, targets, parts, cores


# -- sharded servers ---------------------------------------------------------------------------------

def sharded_case(world_comm, params: int, servers: int, k: int, args) -> list[dict]:
    """Ranks 0..servers+k-1, for `params` parameters: raw MPI and the runtime with ``runtime.servers =
    servers`` and `k` workers (raw MPI before and after the runtime). Returns the record on rank 0."""
    from ..run_description import describe, read_osdp_plan
    from ..runtime.rank.start import setup
    from ..runtime.transport.layout import make_layout

    sub = subgroup(world_comm, servers + k)
    found: list[dict] = []
    if sub is not None:
        ctx = setup(sub)
        ctx.servers = servers
        job = job_for(params, args.warmup + args.iterations, args.sync, not args.no_trace,
                      [*args.set, f"runtime.servers={servers}"])
        layout = make_layout(ctx, describe(job, ctx.workers, read_osdp_plan(job)))
        total = args.warmup + args.iterations
        size = layout.shards[-1].hi
        raw = raw_round_trips(ctx.comm, size, layout.chunks, total, servers=servers, owner=layout.owner)[args.warmup:]
        ours, _, _ = runtime_round_trips(ctx, job, args.warmup)
        raw += raw_round_trips(ctx.comm, size, layout.chunks, total, servers=servers, owner=layout.owner)[args.warmup:]
        raw = ctx.comm.gather(raw, root=0)
        if ctx.rank == 0:
            ours_med = float(np.median([t for times in ours for t in times[args.warmup:]]))
            raw_med = float(np.median([t for times in raw[servers:] for t in times]))
            moved = k * 2 * 4 * size
            name = f"{size:,} params ({4 * size / 2**20:.2f} MiB), {servers} server(s), {k} worker(s)"
            found.append(record("ps", f"sharded round trip {name}", moved / ours_med, "B/s", "raw MPI, same messages",
                                moved / raw_med))
        ctx.comm.Free()
        sub.Free()
    idle_barrier(world_comm)
    return found


# -- the server's update ------------------------------------------------------------------------------

def update_case(params: int, reps: int) -> list[dict]:
    """Rank 0: the server's per-push update against an in-place axpy on `params` float32."""
    from .. import build
    from ..nn import kernels

    job = job_for(params, 1, "asp", False)
    opt = build.optimizer(job, params, fused=kernels.AVAILABLE)  # at every size, small ones too
    numpy_opt = build.optimizer(job, params, fused=False)
    rng = np.random.default_rng(0)
    p = rng.standard_normal(params, dtype=np.float32)
    g = rng.standard_normal(params, dtype=np.float32) * np.float32(1e-3)
    y, x, tmp = p.copy(), g.copy(), np.empty_like(p)
    lr = float(job.optim.lr)
    a = np.float32(lr)

    def update():
        if kernels.all_finite(g):
            opt.step(p, g, lr)

    def numpy_update():
        if np.isfinite(g.max()) and np.isfinite(g.min()):
            numpy_opt.step(p, g, lr)

    def axpy():
        np.multiply(x, a, out=tmp)
        np.add(y, tmp, out=y)

    fns = {"update": update, "numpy update": numpy_update, "axpy": axpy}
    if opt.fused:  # Numba imports
        fns["compiled axpy"] = lambda: _compiled_axpy()(y, x, a)
    t = dict(zip(fns, alternate(list(fns.values()), reps, warmup=2), strict=True))
    nbytes = 4 * params
    name = f"{params:,} params ({nbytes / 2**20:.2f} MiB)"
    how = "fused" if opt.fused else "numpy"
    out = [record("ps", f"update {name}: check + SGD ({how})", nbytes / t["update"], "B/s", "numpy axpy",
                  nbytes / t["axpy"]),
           record("ps", f"update {name}: check + SGD (numpy passes)", nbytes / t["numpy update"], "B/s",
                  "numpy axpy", nbytes / t["axpy"])]
    if "compiled axpy" in t:
        out.append(record("ps", f"update {name}: check + SGD ({how}) vs one-pass axpy", nbytes / t["update"],
                          "B/s", "compiled axpy", nbytes / t["compiled axpy"]))
    return out


@functools.cache
def _compiled_axpy():
    """``y += a * x`` as one compiled loop: three streams of memory traffic, the bandwidth limit
    (momentum SGD needs five, so its ceiling against this is 3/5)."""
    import numba

    @numba.njit(nogil=True, boundscheck=False)
    def axpy(y, x, a):
        for i in range(y.shape[0]):
            y[i] = y[i] + x[i] * a
    return axpy


def main(argv=None, records: list | None = None) -> int:
    args = _parser().parse_args(argv)
    require_ranks("ps", 2)
    sizes = parse_sizes(args.sizes)
    comm = world()
    n = comm.Get_size() - 1
    counts = _counts("--workers", args.workers, n, list(range(1, n + 1)))
    server_counts = _counts("--servers", args.servers, n, [])
    logging.getLogger("ebsp_mpi.runtime").setLevel(logging.WARNING)
    if server_counts:
        return _main_sharded(comm, sizes, server_counts, counts, args, records)
    found = _one_server_cases(comm, sizes, counts, args)
    if comm.Get_rank() == 0:
        _print_one_server(found, args)
        if records is not None:
            records += found["trips"] + found["ceilings"] + found["updates"]
    return 0


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m ebsp_mpi bench ps", description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default=SIZES, help=f"parameter counts (float32), comma-separated "
                                                       f"(default {SIZES})")
    parser.add_argument("--workers", default="", help="numbers of workers at once, comma-separated "
                                                      "(default 1 .. N-1)")
    parser.add_argument("--iterations", type=integer, default=40, help="timed iterations per case (median)")
    parser.add_argument("--warmup", type=integer, default=5, help="untimed iterations first")
    parser.add_argument("--reps", type=integer, default=15, help="timed repetitions of each update (median)")
    parser.add_argument("--sync", default="bsp", choices=POLICIES, help="the server's sync model (default bsp)")
    parser.add_argument("--no-trace", action="store_true", help="run the server and workers without traces")
    parser.add_argument("--set", dest="set", action="append", default=[], metavar="KEY=VALUE",
                        help="override a key of the round trip's job, e.g. --set runtime.chunk_bytes=524288")
    parser.add_argument("--servers", default="", metavar="K,...",
                        help="also the round trip with k server ranks (runtime.servers) and 1 .. N-k workers, "
                             "against raw MPI moving the same messages, for each k, e.g. --servers 1,2,4")
    return parser


def _one_server_cases(comm, sizes: list[int], counts: list[int], args) -> dict:
    """Every round trip case through one server, and (on rank 0) the server's update per size."""
    found = {"trips": [], "ceilings": [], "targets": {}, "parts": {}, "cores": {}, "updates": []}
    with abort_on_failure():
        for size in sizes:
            for k in counts:
                trips, ceiling, aims, split, core = round_trip_case(comm, size, k, args)
                found["trips"] += trips
                found["ceilings"] += ceiling
                found["targets"].update(aims)
                found["parts"].update(split)
                found["cores"].update(core)
        if comm.Get_rank() == 0:
            for size in sizes:
                found["updates"] += update_case(size, args.reps)
        idle_barrier(comm)
    return found


def _print_one_server(found: dict, args) -> None:
    trips, ceilings, updates = found["trips"], found["ceilings"], found["updates"]
    print_table(f"push + pull round trip through the server ({args.sync}, traces "
                f"{'off' if args.no_trace else 'on'}), bytes moved per second; median of "
                f"{args.iterations} iterations per worker after {args.warmup}", trips, found["targets"])
    print_table("the same work without the runtime: raw MPI (blocking waits), with rank 0 checking every "
                "gradient, then updating and sending the reply chunk by chunk as the server does", ceilings)
    print("the runtime against it (ratio): " + ", ".join(
        f"{_short(r['case'])} {r['figure'] / c['figure']:.2f}" for r, c in zip(trips, ceilings, strict=True)))
    print()
    if found["parts"]:
        print("where worker 0's round trip goes (medians, from the traces): push = until the server "
              "holds it; server + pull = sync policy, update, reply")
        for case, split in found["parts"].items():
            print(f"  {case}: " + ", ".join(f"{name} {human(split[name], 's')}"
                                             for name in ("push", "server + pull", "other")))
        print()
    if found["cores"]:
        print("what the server's core does per round (medians): receive = MPI's copy of the push's "
              "chunks (the receiver copies; none for a push read in place); step + reply sends = the "
              "chunked update, each chunk sent when updated")
        for case, core in found["cores"].items():
            print(f"  {case}: " + ", ".join(f"{name} {human(value, 's')}" for name, value in core.items()))
        print()
    print_table(f"the server's update per push (momentum SGD), bytes of gradient per second; median of "
                f"{args.reps}", updates, {r["case"]: UPDATE_TARGET for r in updates if r["reference"] == "numpy axpy"})


def _main_sharded(comm, sizes: list[int], server_counts: list[int], workers: list[int], args,
                  records: list | None) -> int:
    """``--servers``: the round trip with k servers and each number of `workers` the ranks allow."""
    n = comm.Get_size() - 1
    keyed: list[tuple[int, int, int, dict]] = []  # (size, servers, workers, record) on rank 0
    with abort_on_failure():
        for size in sizes:
            for servers in server_counts:
                for k in [k for k in workers if k <= n + 1 - servers]:  # as many as the ranks leave
                    keyed += [(size, servers, k, r) for r in sharded_case(comm, size, servers, k, args)]
        idle_barrier(comm)
    trips = [r for *_, r in keyed]
    if comm.Get_rank() == 0:
        print_table(f"push + pull round trip with sharded servers ({args.sync}, traces "
                    f"{'off' if args.no_trace else 'on'}), bytes moved per second by all workers together; "
                    f"median of {args.iterations} iterations per worker after {args.warmup}", trips)
        base = {(size, k): r["figure"] for size, servers, k, r in keyed if servers == 1}
        gains = [f"{r['case'].removeprefix('sharded round trip ')}: {r['figure'] / base[size, k]:.2f}"
                 for size, servers, k, r in keyed if servers > 1 and (size, k) in base]
        if gains:
            print("against one server with as many workers (ratio of bytes per second):")
            for line in gains:
                print(f"  {line}")
            print()
        if records is not None:
            records += trips
    return 0


def _short(case: str) -> str:
    """``round trip 1,000,010 params (3.81 MiB), 2 worker(s)`` -> ``1,000,010 params x 2``."""
    params, workers = case.removeprefix("round trip ").split(" (")[0], case.split(", ")[-1].split(" ")[0]
    return f"{params} x {workers}"


def _counts(option: str, text: str, n: int, default: list[int]) -> list[int]:
    """``--workers 1,2`` -> [1, 2]: comma-separated numbers, each in 1..n (`default` when empty)."""
    try:
        counts = [int(k) for k in text.split(",") if k.strip()] or default
    except ValueError:
        counts = [0]
    if any(not 1 <= k <= n for k in counts):
        raise UsageError(f"{option} {text}: expected numbers in 1..{n} (one rank at least is left for a "
                         f"server and one for a worker), comma-separated")
    return counts
