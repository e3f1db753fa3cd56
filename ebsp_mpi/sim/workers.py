"""Virtual workers: how long each iteration of each worker takes, and of what it is made.

A virtual worker released at time r for its k-th iteration goes through the phases a live worker's
trace records (``trace.schema.ITERATIONS``): the reply's transit (``down``), its real compute, the
injected straggler delay, the push (``t_push - t_compute_end``) and the push's transit to the server
(``up``). Their sum is the *interval*, release to push arrival, that
:func:`ebsp_mpi.sim.events.simulate` schedules; ``parts(w, start, push)`` gives the phases of worker
w's iterations back for the trace, given their release and push times, and one more: those of the
reply that stopped it.

Two sources:

- :class:`ModelWorkers`: the job's straggler model (``[straggler]``: ``base_s``, ``slowdown``,
  ``jitter_sigma``, ``phases``) with no real compute: an iteration is all emulated compute,
  ``base_s · slowdown[w] · phase(w, t) · J(w, k)`` with the same seeded jitter ``J`` as a live worker
  (:class:`ebsp_mpi.straggler.StragglerModel`) and the slow phases by run time. A job with
  ``base_s = 0`` (the default: a live worker's iteration is then its real compute, which a simulation
  does not have) is simulated with :data:`NOMINAL_BASE_S` in its place.
- :class:`ReplayWorkers`: a recorded run's own phases (``--replay RUN_DIR``), measured on the server's
  clock, cycled when the simulation runs longer than the recording; worker w replays the recorded
  worker ``w mod m`` of m.
"""

from __future__ import annotations

import warnings
from array import array
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..errors import UsageError
from ..straggler import StragglerModel

#: Iterations whose jitter draws come from one generator: as ``straggler._JITTER_BLOCK``, so that the
#: draws equal the live workers' (tests/test_simulate.py checks it against ``StragglerModel.jitter``).
JITTER_BLOCK = 1024
#: Seconds of an iteration (before the slowdown, jitter and phases) when the job's ``straggler.base_s``
#: is 0: the figure of the straggler study (jobs/stragglers/base.toml), so that the default job simulates.
NOMINAL_BASE_S = 0.01


@dataclass
class Parts:
    """Seconds of each phase of some iterations of one worker (arrays of one length)."""

    down: np.ndarray
    compute: np.ndarray
    delay: np.ndarray
    push: np.ndarray
    up: np.ndarray
    #: seconds the reply that stopped the worker took to reach it (replays only)
    stop_down: float = 0.0


class ModelWorkers:
    """Iterations from the straggler model: ``base_s · slowdown[w] · phase(w, t) · J(w, k)`` seconds.

    Parameters
    ----------
    model : StragglerModel
        The job's model for these workers (:func:`ebsp_mpi.straggler.straggler_model`). With
        ``base_s = 0`` the iterations are :data:`NOMINAL_BASE_S` times the same factors, and
        :attr:`source` says so (it goes into the summary's ``simulation`` and the trace attributes).

    Raises
    ------
    UsageError
        When the model is disabled (``straggler.enabled = false``): it then injects nothing into a live
        run, and a simulation has nothing to take iteration times from.
    """

    #: interval() returns finite seconds >= 0 (the model's parameters were checked)
    checked = True
    source = "straggler model"

    def __init__(self, model: StragglerModel):
        if not model.enabled:
            raise UsageError("simulate: straggler.enabled = false gives the virtual workers no iteration times; "
                             "simulate with the straggler model on (straggler.base_s, slowdown, jitter_sigma, "
                             "phases), or --replay a recorded run")
        self.model = model
        self.workers = model.workers
        #: seconds of an iteration before the factors: the job's base_s, or NOMINAL_BASE_S for 0
        self.base_s = model.base_s if model.base_s > 0 else NOMINAL_BASE_S
        if model.base_s <= 0:
            self.source = f"straggler model, straggler.base_s = 0 taken as {NOMINAL_BASE_S} s"
        self._scale = [self.base_s * f for f in model.slowdown]
        self._phases = [tuple((p.t1, p.t2, p.factor) for p in model.phases if p.worker == w)
                        for w in range(model.workers)]
        self._blocks: list[tuple[int, array] | None] = [None] * model.workers

    def interval(self, w: int, k: int, t: float) -> float:
        block, offset = divmod(k, JITTER_BLOCK)
        cached = self._blocks[w]
        if cached is None or cached[0] != block:
            cached = self._blocks[w] = (block, self._block(w, block))
        value = cached[1][offset]
        for t1, t2, factor in self._phases[w]:
            if t1 <= t < t2:
                value *= factor
        return value

    def _block(self, w: int, block: int) -> array:
        """``base_s · slowdown[w] · J(w, k)`` for the iterations of one jitter block."""
        sigma = self.model.jitter_sigma
        if sigma == 0.0:
            values = np.full(JITTER_BLOCK, self._scale[w])
        else:
            key = np.random.SeedSequence([self.model.seed, w, block])
            normals = np.random.Generator(np.random.Philox(key)).standard_normal(JITTER_BLOCK)
            values = self._scale[w] * np.exp(sigma * normals)
        return array("d", values.tobytes())

    def parts(self, w: int, start: np.ndarray, push: np.ndarray) -> Parts:
        """No transit and no real compute: the whole interval is the emulated straggler's delay."""
        zero = np.zeros(len(start) + 1)
        return Parts(down=zero, compute=zero, delay=np.append(push - start, 0.0), push=zero, up=zero)


class ReplayWorkers:
    """Iterations replayed from a recorded run, cycled; worker w replays recorded worker ``w mod m``.

    Parameters
    ----------
    run_dir : path
        A finished or partial run of ``train`` (its server trace and its workers' traces).
    workers : int
        Virtual workers.

    Raises
    ------
    UsageError
        When ``run_dir`` is not a run with the traces a replay needs, naming what is missing.
    """

    checked = True

    def __init__(self, run_dir, workers: int):
        self.run_dir = Path(run_dir)
        self.source = f"replay of {self.run_dir}"
        recording = read_recording(self.run_dir)
        recorded = recording.parts
        self.recorded = len(recorded)
        self.restarts = recording.restarts  # replayed where the workers are the recorded ones (sim.restarts)
        self.workers = workers
        self._parts = [recorded[w % len(recorded)] for w in range(workers)]
        self._intervals = [p.down + p.compute + p.delay + p.push + p.up for p in self._parts]
        self._lists = [iv.tolist() for iv in self._intervals]

    def interval(self, w: int, k: int, t: float) -> float:
        values = self._lists[w]
        return values[k % len(values)]

    def parts(self, w: int, start: np.ndarray, push: np.ndarray) -> Parts:
        p = self._parts[w]
        i = np.arange(len(start) + 1) % len(p.down)
        down = p.down[i]
        down[-1] = p.stop_down  # the stop reply's transit, as recorded (the first reply's carries start-up)
        return Parts(down=down, compute=p.compute[i], delay=p.delay[i], push=p.push[i], up=p.up[i])


@dataclass(frozen=True)
class Restart:
    """A recorded run resumed from its checkpoint: at `t` (seconds, on the run's clock, which goes on
    from the checkpoint) every worker was answered again, worker w for its iteration ``counts[w]``.
    ``waits[w]``: the seconds worker w's iteration before it waited for its reply as recorded (a
    killed run's worker may have had it, and written its row, after the checkpoint), or None where
    its row was lost."""

    t: float
    counts: tuple[int, ...]
    waits: tuple[float | None, ...] = ()


@dataclass
class Recording:
    """What a replay takes from a run: per recorded worker the phases of its iterations, indexed by
    iteration, and the times the run was resumed (empty for a run never stopped)."""

    parts: list[Parts]
    restarts: list[Restart]


def read_replay(run_dir: Path) -> list[Parts]:
    """Per recorded worker, the phases of each of its iterations (see :func:`read_recording`)."""
    return read_recording(run_dir).parts


def read_recording(run_dir: Path) -> Recording:
    """Per recorded worker, the phases of each of its iterations, on the server's clock, and the
    run's restarts.

    For worker w's iteration k, with ``a_k`` its push's arrival (``pushes``) and ``r_k`` the server's
    reply that started it: compute, delay and push come from the worker's own trace (durations on one
    clock, so its clock offset does not matter); the rest of ``a_k - r_k`` is transit, split into the
    reply's (``t_start - r_k``, clipped to it) and the push's. An iteration whose worker row was lost
    (a rank killed before its trace was flushed) takes ``a_k - r_k`` as compute; one whose push the
    server's trace lacks takes its worker's span and the worker's median transit; one with neither,
    the worker's median phases. Entry k is iteration k, so a replay takes each iteration's own time.

    ``r_k`` is the worker's last reply before ``a_k`` (``pulls``, by time), not its k-th: a resumed run
    answers every worker once more when it restarts, after the stop or the reply the killed run gave
    it, so the k-th reply of a run resumed n times may be an earlier iteration's, up to n behind. A
    restart's replies are the ones whose request time is none of the worker's push times and the same
    for the workers (the run's start, on the clock continued from the checkpoint); worker w restarted
    at the iteration of its first push after it.
    """
    where = f"--replay {run_dir}"
    traces, pushes, pulls, servers, workers = _read_traces(run_dir, where)
    recorded, starts, waits = [], [], []
    for w in range(workers):
        parts, started, waited = _recorded_worker(traces.get(w + servers), w, servers, pushes, pulls, where)
        recorded.append(parts)
        starts.append(started)
        waits.append(waited)
    # the run's start and its restarts: times at which the workers' pulls were asked for at once (half of
    # them at least: a reply the policy held past the next checkpoint of a killed run is not in the trace)
    asked = Counter(t for times in starts for t in times)
    return Recording(recorded, _restarts(sorted(t for t, k in asked.items() if 2 * k >= workers)[1:], pushes,
                                         waits))


def _read_traces(run_dir: Path, where: str):
    """The run's traces by rank, the server's ``pushes`` and ``pulls``, and the numbers of servers and
    workers; a UsageError naming `where` when the run has no readable server trace or no worker."""
    from ..trace.frames import servers_of
    from ..trace.reader import TraceError, read_run

    if not (run_dir / "trace").is_dir():
        if (run_dir / "summary.json").is_file():  # a run, made without traces: the replay reads its times there
            raise UsageError(f"{where}: this run wrote no traces (trace.enabled = false), and a replay reads the "
                             f"workers' times from them; replay a run made with traces")
        raise UsageError(f"{where}: not a run directory (no trace/ in it; give the --out of a train run)")
    try:
        with warnings.catch_warnings():  # a damaged rank file is named below, as the replay needs it
            warnings.simplefilter("ignore")
            traces = read_run(run_dir)
    except TraceError as e:
        raise UsageError(f"{where}: {e}") from None
    server = traces.get(0)
    if server is None:
        raise UsageError(f"{where}: no readable server trace (trace/rank-0000.h5)")
    pushes, pulls = server.table("pushes"), server.table("pulls")
    # ranks 0..servers-1 are servers (the shard servers' files hold no table): worker w is rank w + servers
    servers = servers_of(server.config)
    world = max(t.world_size for t in traces.values())
    workers = world - servers
    if workers < 1:
        raise UsageError(f"{where}: the traces name no workers (world size {world} with {servers} server(s))")
    return traces, pushes, pulls, servers, workers


def _recorded_worker(trace, w: int, servers: int, pushes: np.ndarray, pulls: np.ndarray,
                     where: str) -> tuple[Parts, set, dict]:
    """Worker w's phases per iteration, the request times of its pulls that answer none of its pushes
    (the run's start and restarts), and its wait per iteration, from its trace and the server's rows."""
    it = trace.table("iterations") if trace is not None else np.zeros(0)
    if not len(it):
        raise UsageError(f"{where}: no iterations of worker {w} "
                         f"(trace/rank-{w + servers:04d}.h5 missing or empty)")
    mine = pushes[pushes["worker"] == w]
    theirs = pulls[pulls["worker"] == w]
    replies = np.sort(theirs["t_reply"])
    started = set(theirs["t_request"][~np.isin(theirs["t_request"], mine["t"])].tolist())
    parts = _worker_parts(np.sort(it, order="iteration"), mine, replies)
    waited = dict(zip(it["iteration"].tolist(), it["wait_s"].tolist(), strict=True))
    if parts is None:
        raise UsageError(f"{where}: the server recorded no push and reply of worker {w}'s iterations")
    if not (np.all(np.isfinite(parts.compute)) and np.all(np.isfinite(parts.up))):
        raise UsageError(f"{where}: worker {w}'s recorded times are not finite")
    return parts, started, waited


def _worker_parts(it: np.ndarray, pushes: np.ndarray, replies: np.ndarray) -> Parts | None:
    """One worker's phases per iteration 0..K-1 (see :func:`read_recording`), from its ``iterations``
    rows (sorted), the server's rows of its pushes and the times of its replies (sorted); None when no
    iteration has a push and a reply."""
    arrival = dict(zip(pushes["iteration"].tolist(), pushes["t"].tolist(), strict=True))
    count = int(max(it["iteration"].max(), max(arrival, default=-1))) + 1
    a = np.full(count, np.nan)
    a[list(arrival)] = list(arrival.values())
    started_by = np.searchsorted(replies, a, side="left") - 1  # the last reply before each push
    r = np.where(np.isfinite(a) & (started_by >= 0), replies[np.maximum(started_by, 0)], np.nan)
    paired = np.isfinite(a) & np.isfinite(r)
    if not paired.any():
        return None
    row = np.full(count, -1)
    row[it["iteration"]] = np.arange(len(it))
    rows = it[np.maximum(row, 0)]
    have = row >= 0
    delay = np.where(have, np.maximum(rows["injected_delay_s"], 0.0), 0.0)
    compute = np.where(have, np.maximum(rows["t_compute_end"] - rows["t_start"] - delay, 0.0), 0.0)
    push = np.where(have, np.maximum(rows["t_push"] - rows["t_compute_end"], 0.0), 0.0)
    transit = np.where(paired, np.maximum((a - r) - (compute + delay + push), 0.0), np.nan)
    down = np.where(have & paired, np.clip(rows["t_start"] - r, 0.0, transit), 0.0)
    up = transit - down
    whole = have & paired
    if whole.any():  # the worker's median transits stand in for what was lost
        usual_down, usual_up = float(np.median(down[whole])), float(np.median(up[whole]))
    else:
        usual_down, usual_up = 0.0, float(np.median(transit[paired]))
    lost_row = paired & ~have  # the server saw the push: its interval is known, its phases are not
    compute[lost_row], up[lost_row] = transit[lost_row], 0.0
    lost_push = have & ~paired  # the worker's own span, and the usual transit
    down[lost_push], up[lost_push] = usual_down, usual_up
    neither = ~have & ~paired
    if neither.any():
        compute[neither] = float(np.median((compute + delay + push)[have | paired]))
        down[neither], up[neither] = usual_down, usual_up
    # the stop reply: the first reply after the last push, received when the last iteration ended
    last = np.nanmax(a) if np.isfinite(a).any() else np.inf
    after = int(np.searchsorted(replies, last, side="left"))
    stop_down = float(max(0.0, it["t_end"][-1] - replies[after])) if after < len(replies) else 0.0
    return Parts(down=down, compute=compute, delay=delay, push=push, up=up, stop_down=stop_down)


def _restarts(times: list[float], pushes: np.ndarray, waits: list[dict[int, float]]) -> list[Restart]:
    """The restarts at `times`: each worker's iteration there, the first it pushed after (its total
    where it pushed nothing after), and the recorded wait of the iteration before (`waits`: per worker,
    iteration -> ``wait_s`` of its rows)."""
    out = []
    for t in times:
        counts = []
        for w in range(len(waits)):
            mine = pushes[pushes["worker"] == w]
            later = mine["iteration"][mine["t"] > t]
            counts.append(int(later.min()) if len(later) else int(mine["iteration"].max(initial=-1)) + 1)
        out.append(Restart(float(t), tuple(counts), tuple(waits[w].get(c - 1) for w, c in enumerate(counts))))
    return out
