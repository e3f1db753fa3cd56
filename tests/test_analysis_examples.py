"""The example scripts in ``analysis/``: what they compute from a run's traces, and that each draws its
figure from simulated and live runs and ends with one line and exit code 2 on input that is not a run.

The runs: a simulated BSP, ElasticBSP and ASP run of 4 workers (worker 3 three times slower, worker 0 in a
slow phase) and a live ElasticBSP run of 2 workers under ``mpiexec``, all in one directory.
"""

import importlib
import struct
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from ebsp_mpi.cli import main as cli
from ebsp_mpi.trace.frames import load_run
from mpirun import train

pytest.importorskip("pandas")
pytest.importorskip("matplotlib")

ANALYSIS = Path(__file__).resolve().parents[1] / "analysis"
SCRIPTS = ("barrier_waits", "straggler_pattern", "version_lag")
STRAGGLER = ["straggler.base_s=0.01", "straggler.slowdown=[1, 1, 1, 3]", "straggler.jitter_sigma=0.2",
             "straggler.phases=[{worker = 0, t1 = 0.1, t2 = 0.3, factor = 4.0}]"]


def script(name: str):
    """The script as a module (it imports ``common`` from its own folder)."""
    if str(ANALYSIS) not in sys.path:
        sys.path.insert(0, str(ANALYSIS))
    return importlib.import_module(name)


def simulate(out: Path, model: str) -> Path:
    sets = [a for s in [f"sync.model={model}", "sync.lookahead=4", *STRAGGLER] for a in ("--set", s)]
    assert cli(["simulate", "--workers", "4", "--iterations", "30", "-q", "--out", str(out), *sets]) == 0
    return out


@pytest.fixture(scope="module")
def sims(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("runs")
    for model in ("bsp", "elasticbsp", "asp"):
        simulate(root / model, model)
    return root


def png_size(path: Path) -> tuple[int, int]:
    """(width, height) from a PNG's header; fails on anything else."""
    head = path.read_bytes()[:24]
    assert head[:8] == b"\x89PNG\r\n\x1a\n" and head[12:16] == b"IHDR", f"{path} is not a PNG"
    return struct.unpack(">II", head[16:24])


def run_script(name: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(ANALYSIS / f"{name}.py"), *args], capture_output=True, text=True,
                          timeout=120)


# -- what the scripts compute ------------------------------------------------------------------------


def test_bsp_idles_every_worker_but_the_last_to_arrive_at_each_round(sims):
    edges, idle = script("barrier_waits").barrier_waits(load_run(sims / "bsp"))
    assert idle.shape == (4, 30) and len(edges) == 31 and np.all(np.diff(edges) > 0)
    assert np.allclose(np.nanmin(idle, axis=0), 0.0)  # the last to arrive releases the round
    # every worker is in every round but the last, which the others left with their stop reply
    assert not np.isnan(idle[:, :-1]).any() and (idle[:, :-1] >= 0).all()
    assert np.isnan(idle[:3, -1]).all() and idle[3, -1] == 0
    # the 3x straggler is the last to arrive in most rounds, so it waits least in all
    total = np.nansum(idle, axis=1)
    assert np.argmin(total) == 3 and total[:3].min() > 5 * total[3]


def test_elasticbsp_idle_times_are_its_barriers_and_asp_has_none(sims):
    waits = script("barrier_waits")
    frames = load_run(sims / "elasticbsp")
    edges, idle = waits.barrier_waits(frames)
    barriers = frames.table("barriers")
    assert idle.shape == (4, len(barriers)) and len(barriers) > 1
    assert np.allclose(edges[1:], barriers["t_released"])
    # a barrier's observed spread is its longest idle time: last minus first arrival
    assert np.allclose(np.nanmax(idle, axis=0), 1000 * barriers["observed_spread"], atol=1e-6)
    assert waits.barrier_waits(load_run(sims / "asp")) is None


def test_the_straggler_model_rebuilt_from_the_run_gives_its_iteration_times(sims):
    frames = load_run(sims / "bsp")
    model, base = script("straggler_pattern").job_model(frames)
    assert model.slowdown == (1.0, 1.0, 1.0, 3.0) and base == 0.01
    it = frames.table("iterations")
    # a simulated iteration is the model's emulated time of a zero-second compute, jitter and phase included
    emulated = [model.emulated(w, i, 0.0, t) for w, i, t in zip(it["worker"], it["iteration"], it["t_start"],
                                                                 strict=True)]
    assert np.allclose(it["compute_s"] + it["delay_s"], emulated)
    assert (it["t_start"].between(0.1, 0.3) & (it["worker"] == 0)).any()  # the slow phase is drawn


def test_no_barrier_in_any_run_is_one_line_and_exit_code_2(sims, tmp_path, capsys):
    waits = script("barrier_waits")
    common = script("common")
    assert common.main(waits.draw, waits.__doc__, "x.png", [str(sims / "asp"), "--out", str(tmp_path / "x.png")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.endswith("error: no barriers (BSP or ElasticBSP) in asp (simulated)\n")
    assert not (tmp_path / "x.png").exists()


# -- the scripts from the command line ---------------------------------------------------------------


@pytest.fixture(scope="module")
def live(sims) -> Path:
    """A live ElasticBSP run of 2 workers (worker 1 three times slower) beside the simulated ones."""
    out = sims / "live"
    p = train(3, out, "sync.model=elasticbsp", "sync.lookahead=4", "stop.iterations=20", "straggler.base_s=0.002",
              "straggler.slowdown=[1, 3]", timeout=120)
    assert p.returncode == 0, p.stderr
    return out


@pytest.mark.slow
@pytest.mark.parametrize("name", SCRIPTS)
def test_each_script_draws_its_figure_from_live_and_simulated_runs(name, sims, live, tmp_path):
    # straggler_pattern draws one run: the live one, whose compute is real
    source = live if name == "straggler_pattern" else sims
    out = tmp_path / "fig" / f"{name}.png"
    p = run_script(name, str(source), "--out", str(out))
    assert p.returncode == 0, p.stderr
    assert p.stdout == f"{out}\n"
    width, height = png_size(out)
    assert width >= 1000 and height >= 400 and out.stat().st_size > 20_000


@pytest.mark.slow
@pytest.mark.parametrize("name", SCRIPTS)
def test_a_directory_that_is_not_a_run_is_one_line_and_exit_code_2(name, tmp_path):
    (tmp_path / "notes").mkdir()
    p = run_script(name, str(tmp_path / "notes"), "--out", str(tmp_path / "x.png"))
    assert p.returncode == 2 and p.stdout == ""
    assert p.stderr.count("\n") == 1 and p.stderr.startswith(f"{name}.py: error: {tmp_path / 'notes'}: neither a run")
    assert not (tmp_path / "x.png").exists()
