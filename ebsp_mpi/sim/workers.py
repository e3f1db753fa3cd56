"""Virtual workers: how long each iteration of each worker takes, and of what it is made.

A virtual worker released at time r for its k-th iteration goes through the phases a live worker's
trace records (``trace.schema.ITERATIONS``): the reply's transit (``down``), its real compute, the
injected straggler delay, the push (``t_push - t_compute_end``) and the push's transit to the server
(``up``). Their sum is the *interval*, release to push arrival, that
:func:`ebsp_mpi.sync.simulate.simulate` schedules; ``parts(w, start, push)`` gives the phases of worker
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
        recorded = read_replay(self.run_dir)
        self.recorded = len(recorded)
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


def read_replay(run_dir: Path) -> list[Parts]:
    """Per recorded worker, the phases of each of its iterations, on the server's clock.

    For worker w's iteration k, with ``r_k`` the server's reply that started it (``pulls``, in order)
    and ``a_k`` its push's arrival (``pushes``): compute, delay and push come from the worker's own
    trace (durations on one clock, so its clock offset does not matter); the rest of ``a_k - r_k`` is
    transit, split into the reply's (``t_start - r_k``, clipped to it) and the push's.
    """
    from ..trace.frames import servers_of
    from ..trace.reader import TraceError, read_run

    where = f"--replay {run_dir}"
    if not (run_dir / "trace").is_dir():
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
    recorded = []
    for w in range(workers):
        trace = traces.get(w + servers)
        it = trace.table("iterations") if trace is not None else np.zeros(0)
        if not len(it):
            raise UsageError(f"{where}: no iterations of worker {w} "
                             f"(trace/rank-{w + servers:04d}.h5 missing or empty)")
        it = np.sort(it, order="iteration")
        mine = pushes[pushes["worker"] == w]
        arrival = dict(zip(mine["iteration"].tolist(), mine["t"].tolist(), strict=True))
        replies = np.sort(pulls["t_reply"][pulls["worker"] == w])
        keep = [i for i, k in enumerate(it["iteration"].tolist()) if k in arrival and k < len(replies)]
        if not keep:
            raise UsageError(f"{where}: the server recorded no push and reply of worker {w}'s iterations")
        # the stop reply: the reply after the last push, received when the last iteration ended
        stop_down = float(max(0.0, it["t_end"][-1] - replies[len(it)])) if len(replies) > len(it) else 0.0
        it = it[keep]
        k = it["iteration"]
        a = np.array([arrival[i] for i in k.tolist()])
        r = replies[k]
        delay = np.maximum(it["injected_delay_s"], 0.0)
        compute = np.maximum(it["t_compute_end"] - it["t_start"] - delay, 0.0)
        push = np.maximum(it["t_push"] - it["t_compute_end"], 0.0)
        transit = np.maximum((a - r) - (compute + delay + push), 0.0)
        down = np.clip(it["t_start"] - r, 0.0, transit)
        recorded.append(Parts(down=down, compute=compute, delay=delay, push=push, up=transit - down,
                              stop_down=stop_down))
        if not np.all(np.isfinite(a - r)):
            raise UsageError(f"{where}: worker {w}'s recorded times are not finite")
    return recorded
