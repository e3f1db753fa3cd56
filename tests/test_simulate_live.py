"""A live run and its simulation agree: ``simulate --replay`` of a 4-worker MPI run under a straggler
(worker 3 three times slower, log-normal jitter) gives every worker's iterations per second and total
waiting within 10 % of the run's own, for every sync model.

Tolerance: 10 % relative, per worker and per quantity (:data:`TOLERANCE`). The replay takes each
iteration's compute, delay, push and transits as recorded, so what is left to disagree is the sync
policy's decisions and the order of events; a model whose decisions depended on something the replay
does not reproduce would show here.
"""

import subprocess
import sys
import warnings

import pytest

pytest.importorskip("pandas")  # the analysis extra; the Open MPI pass of .ci/run installs only the test extra

from ebsp_mpi.analysis.metrics import worker_stats
from ebsp_mpi.trace.frames import load_run
from mpirun import child_env, train

#: relative difference allowed between the live run and its replay, per worker
TOLERANCE = 0.10

#: 4 workers, worker 3 three times slower; 10 ms of emulated compute per iteration with jitter; no
#: evaluation during the run (it would take the server's core at moments the replay cannot know)
COMMON = ["straggler.slowdown=[1, 1, 1, 3]", "straggler.jitter_sigma=0.2", "straggler.base_s=0.01",
          "stop.iterations=100", "stop.epochs=0", "stop.seconds=0", "eval.every_seconds=1000",
          "optim.momentum=0.5"]
MODELS = {
    "bsp": ["sync.model=bsp"],
    "asp": ["sync.model=asp"],
    "ssp": ["sync.model=ssp", "sync.staleness=2"],
    "dssp": ["sync.model=dssp", "sync.staleness=1", "sync.dssp_range=3"],
    "elasticbsp": ["sync.model=elasticbsp", "sync.lookahead=15"],
    # its barriers move while members are held (sync.replan), which the server carries out as any release
    "elasticbsp-replan": ["sync.model=elasticbsp", "sync.lookahead=15", "sync.predictor=ema", "sync.ema_alpha=0.3",
                          "sync.zipline_z=auto", "sync.replan=overdue"],
    "psp": ["sync.model=psp", "sync.sample=2", "sync.staleness=1"],
}

#: per model, one whose waiting differs under this straggler: ASP holds no one; SSP, DSSP and PSP with a
#: small bound end up holding the fast workers for the straggler about as much as BSP does, and
#: ElasticBSP's barriers (placed where the spread is least) about as little as ASP
CONTROL = {"bsp": "asp", "asp": "bsp", "ssp": "asp", "dssp": "asp", "elasticbsp": "bsp",
           "elasticbsp-replan": "bsp", "psp": "asp"}


def _stats(run_dir):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # a simulated run's trace has no losses (NaN): nothing to warn of
        return worker_stats(load_run(run_dir))


@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.parametrize("model", MODELS)
def test_a_replay_of_a_live_run_agrees_with_it(tmp_path, model):
    live, sim = tmp_path / "live", tmp_path / "sim"
    p = train(5, live, *COMMON, *MODELS[model], timeout=180)
    assert p.returncode == 0, p.stderr
    replay(live, sim)
    a, b = _stats(live), _stats(sim)
    assert list(a.index) == list(b.index) == [0, 1, 2, 3]
    for column in ("iterations_per_s", "wait_s"):
        off = (b[column] - a[column]).abs() / a[column]
        print(f"{model}: {column} largest relative difference {off.max():.2%}")  # shown with pytest -s
        assert (off <= TOLERANCE).all(), (f"{model}: {column} live {a[column].round(4).tolist()}, "
                                          f"replayed {b[column].round(4).tolist()}")
    # the control: the same times under a model that waits very differently do not agree, so the
    # agreement above is the policy's doing
    other = CONTROL[model]
    replay(live, tmp_path / other, "--set", f"sync.model={other}")
    assert ((_stats(tmp_path / other)["wait_s"] - a["wait_s"]).abs() / a["wait_s"] > TOLERANCE).any()


def replay(live, out, *args):
    q = subprocess.run([sys.executable, "-m", "ebsp_mpi", "simulate", "--replay", str(live), "--out", str(out), "-q",
                        *args], capture_output=True, text=True, timeout=120, env=child_env())
    assert q.returncode == 0, q.stderr


@pytest.mark.slow
@pytest.mark.timeout(200)
def test_a_replay_of_a_run_with_two_servers_finds_its_workers_after_them(tmp_path):
    """With runtime.servers = 2, rank 1 is a shard server and worker w is rank w + 2: the replay reads
    each worker's iterations from its own rank, and the simulated run (one server) is read back with
    the same worker indices and the same figures."""
    live, sim = tmp_path / "live", tmp_path / "sim"
    # the common job (a later --set wins) with two servers and three workers, worker 2 the straggler
    p = train(5, live, *COMMON, "runtime.servers=2", "straggler.slowdown=[1, 1, 3]", "stop.iterations=30",
              "sync.model=bsp", timeout=120)
    assert p.returncode == 0, p.stderr
    replay(live, sim)
    a, b = _stats(live), _stats(sim)
    assert list(a.index) == list(b.index) == [0, 1, 2]
    for column in ("iterations_per_s", "wait_s"):
        off = (b[column] - a[column]).abs() / a[column]
        assert (off <= TOLERANCE).all(), (f"{column} live {a[column].round(4).tolist()}, "
                                          f"replayed {b[column].round(4).tolist()}")
