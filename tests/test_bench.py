"""``python -m ebsp_mpi bench KIND``: every kind runs on tiny sizes and hands back well-formed records.

Kinds that need ranks run under ``mpiexec`` as subprocesses with a timeout. Only the structure of the
records and the sign of their figures are asserted, never a speed.
"""

import json
import math
import re
import subprocess
import sys

import numpy as np
import pytest

from ebsp_mpi.bench import KINDS, report
from ebsp_mpi.nn import kernels
from ebsp_mpi.outputs import read_model
from ebsp_mpi.runtime.transport.env import launch_command
from mpirun import child_env, local, mpiexec, train

pytestmark = pytest.mark.timeout(180)

UNITS = {"B/s", "s", "samples/s"}


def run_bench(tmp_path, kind, *options, ranks=None, timeout=150):
    """Run ``bench KIND --json FILE OPTIONS`` (under ``mpiexec -n ranks`` when given); its records."""
    out = tmp_path / f"{kind}.json"
    cmd = [sys.executable, "-m", "ebsp_mpi", "bench", kind, "--json", str(out), *options]
    if ranks:
        cmd = [*launch_command(mpiexec(), ranks), *cmd]
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=child_env())
    except subprocess.TimeoutExpired as e:
        pytest.fail(f"bench {kind} did not finish in {timeout} s:\n{e.stdout}\n{e.stderr}")
    assert p.returncode == 0, p.stdout + p.stderr
    assert f"wrote {len(json.loads(out.read_text()))} records" in p.stdout
    return json.loads(out.read_text()), p.stdout


def check_records(records, kind):
    assert records, f"bench {kind} produced no records"
    for r in records:
        assert list(r) == list(report.KEYS)
        assert r["kind"] == kind
        assert r["unit"] in UNITS
        assert r["case"] and r["reference"]
        assert r["figure"] > 0 and r["reference_figure"] > 0
        assert math.isclose(r["ratio"], r["figure"] / r["reference_figure"])
    assert len({(r["case"], r["reference"]) for r in records}) == len(records), "cases must be distinct"


# -- the records and their table ---------------------------------------------------------------------

def test_a_record_holds_the_figure_its_reference_and_their_ratio():
    r = report.record("ps", "round trip", 3e9, "B/s", "raw MPI", 4e9)
    assert list(r) == list(report.KEYS)
    assert r["ratio"] == pytest.approx(0.75)
    assert math.isnan(report.record("x", "c", 1.0, "s", "ref", 0.0)["ratio"])


def test_sizes_parse_with_binary_suffixes_and_bad_ones_name_the_text():
    assert report.parse_sizes("4K, 64MiB,1e6,512") == [4096, 64 << 20, 1_000_000, 512]
    assert report.size_label(4096) == "4 KiB" and report.size_label(64 << 20) == "64 MiB"
    assert report.size_label(1000) == "1000 B"
    with pytest.raises(ValueError, match="'12Q'"):
        report.parse_size("12Q")
    with pytest.raises(ValueError, match="whole number"):
        report.parse_size("0.5")


def test_figures_print_in_readable_units(capsys):
    assert report.human(2.5e9, "B/s") == "2.50 GB/s"
    assert report.human(3.2e-6, "s") == "3.2 us"
    assert report.human(0.0171, "s") == "17.1 ms"
    assert report.human(48213.7, "samples/s") == "48,214 samples/s"
    rows = [report.record("overhead", "bsp", 0.0115, "s", "single process", 0.01),
            report.record("overhead", "asp", 0.02, "s", "single process", 0.01)]
    report.print_table("title", rows, {"bsp": ("<=", 1.15), "asp": ("<=", 1.15)})
    out = capsys.readouterr().out.splitlines()
    assert out[0] == "title"
    assert out[3].rstrip().endswith("<= 1.15 yes") and out[4].rstrip().endswith("<= 1.15 NO")


def test_alternate_times_every_function_the_same_number_of_times():
    calls = {"a": 0, "b": 0}

    def a():
        calls["a"] += 1

    def b():
        calls["b"] += 1

    medians = report.alternate([a, b], reps=5, warmup=2)
    assert calls == {"a": 7, "b": 7}
    assert len(medians) == 2 and all(m >= 0 for m in medians)


# -- the command ----------------------------------------------------------------------------------

def test_every_kind_names_a_module_with_main():
    import importlib

    assert set(KINDS) == {"mpi", "ps", "overhead", "hybcomm", "nn", "zipline", "simulate", "train", "cluster"}
    for name, kind in KINDS.items():
        assert callable(importlib.import_module(kind.module).main), name


@pytest.mark.parametrize("kind", ["mpi", "ps", "overhead"], ids=lambda kind: f"bench-{kind}")  # not "mpi":
# pytest-mpi would take that id for its marker
def test_a_kind_that_needs_ranks_says_how_to_start_it(kind):
    p = subprocess.run([sys.executable, "-m", "ebsp_mpi", "bench", kind], capture_output=True, text=True,
                       timeout=60, env=child_env())
    assert p.returncode == 2
    assert f"mpiexec -n 2 python -m ebsp_mpi bench {kind}" in p.stderr
    assert "Traceback" not in p.stderr


def test_an_unknown_kind_is_refused_with_the_list():
    p = subprocess.run([sys.executable, "-m", "ebsp_mpi", "bench", "gpu"], capture_output=True, text=True,
                       timeout=60, env=child_env())
    assert p.returncode == 2
    assert "'gpu'" in p.stderr and all(f"'{kind}'" in p.stderr for kind in KINDS)


def test_zipline_writes_one_record_per_comparison(tmp_path):
    records, out = run_bench(tmp_path, "zipline", "--reps", "1", "--brute-limit", "1e5")
    check_records(records, "zipline")
    assert {r["reference"] for r in records} == {"heapq scan", "brute force", "zipline"}
    assert sum(r["reference"] == "heapq scan" for r in records) == 6  # every instance
    assert sum(r["reference"] == "zipline" for r in records) == 6  # robust ZipLine against it
    assert "heap/zipline" in out and "robust/zipline" in out


def test_nn_writes_one_record_per_layer_case(monkeypatch):
    pytest.importorskip("torch")
    from ebsp_mpi.bench import nn

    # the layer shapes shrunk so that the comparison runs in a moment
    monkeypatch.setattr(nn, "DENSE", ((4, 8, 6),))
    monkeypatch.setattr(nn, "CONV", ((2, 3, 4, 6),))
    monkeypatch.setattr(nn, "POOL", ((2, 3, 4),))
    monkeypatch.setattr(nn, "SGD_SIZE", 1000)
    records: list[dict] = []
    assert nn.main(["--reps", "2", "--warmup", "1"], records=records) == 0
    check_records(records, "nn")
    assert [r["case"].split()[0] for r in records] == ["Dense", "Conv2D", "MaxPool2D", "SGD.step"]


def test_nn_without_torch_is_one_line_and_writes_no_json(tmp_path, monkeypatch, capsys):
    """Without PyTorch there is nothing to compare: one line, exit 2, and no JSON file (an empty list
    in it would read as a benchmark that ran and measured nothing)."""
    from ebsp_mpi.cli import main

    monkeypatch.setitem(sys.modules, "torch", None)  # import torch raises ImportError
    out = tmp_path / "nn.json"
    assert main(["bench", "nn", "--json", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("ebsp_mpi: error: bench nn") and "pip install torch" in err[0], err
    assert not out.exists()


def test_simulate_times_every_policy_against_the_bare_loop(tmp_path):
    records, out = run_bench(tmp_path, "simulate", "--workers", "8", "--iterations", "20")
    check_records(records, "simulate")
    assert len(records) == 6 and {r["reference"] for r in records} == {"bare heapq loop"}
    assert "8 workers x 20 iterations = 160 pushes" in out
    # the barriers column says each timed simulation ran the iterations asked: BSP one a superstep, ASP none
    barriers = {row.split("|")[0].strip(): row.split("|")[-1].split()[0] for row in out.splitlines()
                if row.count("|") == 3}
    assert barriers["bsp"] == "20" and barriers["asp"] == "0", out


def test_simulate_train_times_the_emulation_against_the_same_gradients_in_a_bare_loop(tmp_path):
    records, out = run_bench(tmp_path, "simulate", "--train", "--workers", "4", "--iterations", "5",
                             "--policies", "bsp,asp")
    check_records(records, "simulate")
    assert [r["case"] for r in records] == ["train bsp n=4 K=5", "train asp n=4 K=5"]
    assert {r["reference"] for r in records} == {"bare gradient + step loop"}
    assert "20 gradients" in out


@pytest.fixture
def fake_gpu(monkeypatch):
    """bench nn's GPU path with the fake CuPy as our side and PyTorch on the CPU as theirs."""
    torch = pytest.importorskip("torch")
    import fakecupy
    from ebsp_mpi.bench import nn

    fakecupy.install(monkeypatch)
    monkeypatch.setattr(nn, "GPU_DENSE", ((4, 8, 6),))
    monkeypatch.setattr(nn, "GPU_CONV", ((2, 3, 4, 6),))
    monkeypatch.setattr(nn, "GPU_POOL", ((2, 3, 4),))
    monkeypatch.setattr(nn, "SGD_SIZE", 1000)
    sync = fakecupy.cuda.get_current_stream().synchronize
    device = nn.Device("cuda", fakecupy, "cpu", sync, lambda: None)
    monkeypatch.setattr(nn, "_device", lambda name, torch: device)
    return nn, torch, device


def test_nn_on_a_gpu_times_the_same_work_on_both_sides(fake_gpu):
    nn, torch, device = fake_gpu
    rng = np.random.default_rng(0)
    for kind, desc, ours, theirs in nn._layer_cases(torch, rng, device):
        _, dx = ours()
        torch_dx = theirs()[0]
        # the input gradient of the same layer, weights and upstream gradient: equal up to float32
        np.testing.assert_allclose(device.to_host(dx), torch_dx.detach().numpy(), rtol=1e-4, atol=1e-5,
                                   err_msg=f"{kind} {desc}")


def test_nn_on_a_gpu_writes_one_record_per_case(fake_gpu):
    nn, _, _ = fake_gpu
    records: list[dict] = []
    assert nn.main(["--device", "cuda", "--reps", "2", "--warmup", "1"], records=records) == 0
    check_records(records, "nn")
    assert all(r["case"].endswith("(cuda)") for r in records)
    assert [r["case"].split()[0] for r in records] == ["Dense", "Conv2D", "MaxPool2D", "SGD.step"]


def test_nn_on_a_gpu_refuses_in_one_line_where_there_is_none(monkeypatch):
    torch = pytest.importorskip("torch")
    from ebsp_mpi.backend import BackendError
    from ebsp_mpi.bench import nn

    monkeypatch.setitem(sys.modules, "cupy", None)   # CuPy cannot be imported
    with pytest.raises(BackendError, match="cupy"):
        nn._device("cuda", torch)


# -- under mpiexec --------------------------------------------------------------------------------

@pytest.mark.slow
def test_mpi_measures_bandwidth_and_latency_for_every_size(tmp_path):
    records, out = run_bench(tmp_path, "mpi", "--sizes", "4K,256K", "--reps", "3", "--warmup", "1", ranks=3)
    check_records(records, "mpi")
    # from 256 KiB each size is also sent cold, from buffers beyond the caches
    assert [r["case"] for r in records] == ["bandwidth 4 KiB", "latency 4 KiB", "bandwidth 256 KiB",
                                            "latency 256 KiB", "cold bandwidth 256 KiB"]
    assert [r["unit"] for r in records] == ["B/s", "s", "B/s", "s", "B/s"]
    for bandwidth, latency, size in zip(records[:4:2], records[1:4:2], (4096, 256 << 10), strict=True):
        assert bandwidth["figure"] == pytest.approx(size / latency["figure"])
    assert records[4]["reference_figure"] == records[2]["figure"]  # against the same size from cache
    assert "raw MPI ping-pong" in out and "cold" in out


@pytest.mark.slow
def test_ps_runs_the_server_with_each_number_of_workers(tmp_path):
    records, out = run_bench(tmp_path, "ps", "--sizes", "2e3", "--iterations", "4", "--warmup", "1",
                             "--reps", "2", ranks=3)
    check_records(records, "ps")
    trips = [r for r in records if r["case"].startswith("round trip")]
    updates = [r for r in records if r["case"].startswith("update")]
    assert [r["case"].split(", ")[-1] for r in trips] == ["1 worker(s)", "2 worker(s)"]
    assert {r["reference"] for r in trips} == {"raw MPI, same messages"}
    assert [r["reference"] for r in updates] == ["numpy axpy", "numpy axpy"] + ["compiled axpy"] * kernels.AVAILABLE
    assert "fused" in updates[0]["case"] if kernels.AVAILABLE else "numpy" in updates[0]["case"]
    assert all(r["unit"] == "B/s" for r in records)
    core = out[out.index("what the server's core does per round"):]
    for trip in trips:  # BSP: the server's core time per round is profiled for every case
        assert f"  {trip['case']}: receive " in core and ", step + reply sends " in core
    ceilings = [r for r in records if r["case"].startswith("server's work in raw MPI")]
    assert [c["case"].removeprefix("server's work in raw MPI ") for c in ceilings] == \
        [t["case"].removeprefix("round trip ") for t in trips]
    assert [c["reference_figure"] for c in ceilings] == [t["reference_figure"] for t in trips]
    assert "the runtime against it (ratio): 2,010 params x 1 " in out and ", 2,010 params x 2 " in out


@pytest.mark.mpi_impl  # Open MPI attaches no MPI_TAG_UB to a split communicator, as the sharded cases use
def test_ps_with_servers_runs_each_number_of_servers_with_the_workers_left(tmp_path):
    records, out = run_bench(tmp_path, "ps", "--sizes", "2e4", "--iterations", "4", "--warmup", "1",
                             "--servers", "1,2", ranks=4)
    check_records(records, "ps")
    cases = [r["case"].split("MiB), ")[-1] for r in records]
    assert cases == ["1 server(s), 1 worker(s)", "1 server(s), 2 worker(s)", "1 server(s), 3 worker(s)",
                     "2 server(s), 1 worker(s)", "2 server(s), 2 worker(s)"]
    assert {r["reference"] for r in records} == {"raw MPI, same messages"}
    assert all(r["figure"] > 0 and r["reference_figure"] > 0 for r in records)
    assert "against one server with as many workers" in out
    # a ratio for each case with 2 servers, against the one-server case of as many workers
    assert len(re.findall(r"2 server\(s\), [12] worker\(s\): \d+\.\d\d", out)) == 2


def test_the_server_work_of_the_raw_reference_is_the_servers_bsp_step():
    from ebsp_mpi import build
    from ebsp_mpi.bench.ps import ServerWork, job_for
    from ebsp_mpi.runtime.transport.protocol import plan_chunks

    job = job_for(2000, 1, "bsp", False)
    size = 2000
    rng = np.random.default_rng(3)
    grads = [rng.standard_normal(size, dtype=np.float32) for _ in range(3)]
    params = rng.standard_normal(size, dtype=np.float32)
    expected, oracle = params.copy(), build.optimizer(job, size)
    mean = (grads[0] + grads[1] + grads[2]) * np.float32(1 / 3)
    oracle.step(expected, mean, float(job.optim.lr))
    work = ServerWork(job, size, 3)
    for c in plan_chunks([(0, size)], 4, 4 * 700, 1 << 20):  # three chunks, as the reply is cut
        work.step(grads, params, c)
    np.testing.assert_array_equal(params, expected)


def test_the_core_timers_split_a_round_into_receiving_and_the_step(monkeypatch):
    """bench ps watches rank 0 through a ServerProbe (no method of the server replaced): a round closed
    inside a poll counts the poll's time before it as receiving, and the next poll's receiving starts
    when the round ended."""
    from ebsp_mpi.bench import ps

    clock = iter([1.0, 1.5, 1.75, 2.0, 2.25, 3.0])
    monkeypatch.setattr(ps.time, "perf_counter", lambda: next(clock))
    timers = ps.core_timers()
    timers.serving()  # 1.0
    timers.round_begins()  # 1.5: 0.5 s of receiving before the round
    timers.round_ends(True)  # 1.75: the step and the reply sends took 0.25 s
    timers.served(True)  # 2.0: 0.25 s more of receiving after the round, for the next one
    timers.serving()  # 2.25
    timers.served(False)  # a poll that found nothing adds nothing
    timers.round_begins()  # 3.0
    timers.round_ends(False)  # a round still waiting for a push is not one
    assert timers.rounds == [(0.5, 0.25, 1.5)]
    assert timers.receive == pytest.approx(0.25)


@pytest.mark.slow
def test_overhead_compares_bsp_with_the_single_process_trainer(tmp_path):
    records, out = run_bench(tmp_path, "overhead", "--iterations", "6", "--warmup", "2", "--reps", "1",
                             "--set", "model.hidden=[16]", "--set", "data.synthetic_samples=400", ranks=2)
    check_records(records, "overhead")
    assert [("traces on" in r["case"], "traces off" in r["case"]) for r in records] == [(True, False),
                                                                                       (False, True)]
    assert all(r["reference"] == "single process" and r["unit"] == "s" for r in records)
    assert "batch 64" in records[0]["case"]
    line = next(x for x in out.splitlines() if x.startswith("forward + backward alone"))
    assert all(f"{who} " in line for who in ("single process", "BSP worker, traces on", "BSP worker, traces off"))
    line = next(x for x in out.splitlines() if x.startswith("ratio in each repetition"))
    on, off = line.split(": ", 1)[1].split("; ")
    assert on.startswith("traces on ") and off.startswith("traces off ")
    assert all(float(part.split()[-1]) > 0 for part in (on, off)) and "," not in on + off  # --reps 1


def test_train_runs_mpi_and_the_single_process_trainer_on_the_same_job(tmp_path):
    records, out = run_bench(tmp_path, "train", "--sizes", "small", "--models", "bsp,asp", "--workers", "2",
                             "--reps", "1", "--no-ddp", "--set", "stop.iterations=5", timeout=170)
    check_records(records, "train")
    assert [r["case"] for r in records] == ["small, BSP, 2 workers / single process",
                                            "small, ASP, 2 workers / single process"]
    assert all(r["unit"] == "samples/s" for r in records)
    assert "PyTorch left out: --no-ddp" in out


@pytest.mark.parametrize("timeout, says", [("0", "--timeout 0: must be"), ("-5", "--timeout -5: must be"),
                                           ("nan", "--timeout nan: must be"),
                                           ("0.01", "did not finish within --timeout 0.01 s")])
def test_train_refuses_a_timeout_it_cannot_keep_in_one_line(timeout, says):
    p = subprocess.run([sys.executable, "-m", "ebsp_mpi", "bench", "train", "--sizes", "small", "--models", "bsp",
                        "--workers", "1", "--reps", "1", "--no-ddp", "--timeout", timeout],
                       capture_output=True, text=True, timeout=120, env=child_env())
    assert p.returncode == 2 and says in p.stderr and "Traceback" not in p.stderr, p.stderr


def test_train_names_a_bad_worker_count_first():
    p = subprocess.run([sys.executable, "-m", "ebsp_mpi", "bench", "train", "--workers", "0"],
                       capture_output=True, text=True, timeout=60, env=child_env())
    assert p.returncode == 2 and "--workers 0, --reps 3: each must be at least 1" in p.stderr, p.stderr


def test_train_refuses_an_unknown_size_in_one_line():
    p = subprocess.run([sys.executable, "-m", "ebsp_mpi", "bench", "train", "--sizes", "huge"],
                       capture_output=True, text=True, timeout=60, env=child_env())
    assert p.returncode == 2 and "'huge'" in p.stderr and "Traceback" not in p.stderr


def test_the_ddp_peer_trains_the_same_mlp():
    pytest.importorskip("torch")
    p = subprocess.run([sys.executable, "-m", "ebsp_mpi.bench.ddp", "--workers", "2", "--set", "stop.iterations=100",
                        "--set", "stop.epochs=0"], capture_output=True, text=True, timeout=170, env=child_env())
    assert p.returncode == 0, p.stderr
    result = json.loads(p.stdout.strip().splitlines()[-1])
    assert result["samples_per_second"] > 0 and result["test_accuracy"] > 0.5  # it learned: not chance (0.1)


def test_train_on_the_gpu_runs_ours_on_cupy_against_the_same_cnn(tmp_path):
    """``--device cuda`` on the fake device: every run of ours computes on CuPy (the fake counts device
    arrays per process), the cnn size trains from its temporary image file, and PyTorch is left out
    in one line where it sees no GPU (or does not import)."""
    import fakecupy

    report_dir = tmp_path / "fakecupy"
    report_dir.mkdir()
    out = tmp_path / "train.json"
    p = subprocess.run([sys.executable, "-m", "ebsp_mpi", "bench", "train", "--json", str(out), "--device", "cuda",
                        "--sizes", "cnn", "--models", "bsp", "--workers", "1", "--reps", "1",
                        "--set", "stop.iterations=3"], capture_output=True, text=True, timeout=170,
                       env={**child_env(), **fakecupy.child_env(devices=1, report=report_dir)})
    assert p.returncode == 0, p.stdout + p.stderr
    records = json.loads(out.read_text())
    check_records(records, "train")
    assert [r["case"] for r in records] == ["cnn, BSP, 1 workers (cuda) / single process"]
    assert "PyTorch left out: " in p.stdout
    counters = [json.loads(f.read_text()) for f in report_dir.glob("*.json")]
    on_device = [c for c in counters if c["devices_used"]]
    assert len(on_device) >= 2, counters  # the MPI run's worker and the single-process trainer


def test_the_torch_peer_builds_our_networks_layer_for_layer():
    torch = pytest.importorskip("torch")
    from ebsp_mpi import build
    from ebsp_mpi.bench.torch_peer import torch_model
    from ebsp_mpi.config import load_job

    for overrides in (["model.hidden=[32,16]"], ["model.kind=cnn", "model.channels=[4,8,6]", "model.hidden=[12]"]):
        job = load_job(None, overrides)
        ds = build.dataset(job)
        ours = build.model(job, ds)
        theirs = torch_model(job, ds)
        shapes = [tuple(t.shape) for t in theirs.parameters()]
        assert sum(map(math.prod, shapes)) == ours.space.size
        with torch.no_grad():
            logits = theirs(torch.from_numpy(ds.x_test[:5]))
        assert tuple(logits.shape) == (5, ds.num_classes)


def test_the_torch_peer_trains_on_its_device():
    pytest.importorskip("torch")
    p = subprocess.run([sys.executable, "-m", "ebsp_mpi.bench.torch_peer", "--set", "stop.iterations=100",
                        "--set", "stop.epochs=0"], capture_output=True, text=True, timeout=170, env=child_env())
    assert p.returncode == 0, p.stderr
    result = json.loads(p.stdout.strip().splitlines()[-1])
    assert result["samples_per_second"] > 0 and result["test_accuracy"] > 0.5  # it learned: not chance (0.1)


def hybcomm_rows(out):
    """The rows of ``bench hybcomm``'s table: (layer, K, workers, scheme, worker B/it, model, server B/it,
    model, seconds per iteration, ratio to ps) as printed."""
    rows = []
    for line in out.splitlines():
        cells = [c.strip() for c in line.split("|")]
        if len(cells) == 10 and cells[1].isdigit():
            rows.append((cells[0], int(cells[1]), int(cells[2]), cells[3],
                         *(int(c.replace(",", "")) for c in cells[4:8]), cells[8], float(cells[9])))
    return rows


def test_hybcomm_asks_for_a_server_and_two_workers():
    p = subprocess.run([sys.executable, "-m", "ebsp_mpi", "bench", "hybcomm"], capture_output=True, text=True,
                       timeout=60, env=child_env())
    assert p.returncode == 2
    assert "mpiexec -n 3 python -m ebsp_mpi bench hybcomm" in p.stderr and "Traceback" not in p.stderr


@pytest.mark.slow
def test_hybcomm_counts_exactly_the_bytes_the_cost_model_predicts(tmp_path):
    from ebsp_mpi.plan.hybcomm import ps_bytes, sfb_bytes

    # 64x32 at K = 4: SFB moves fewer bytes (auto by bytes alone takes it); 8x4 at K = 16: PS does
    records, out = run_bench(tmp_path, "hybcomm", "--shapes", "64x32:4,8x4:16", "--iterations", "5",
                             "--warmup", "1", "--set", "comm.sfb_overhead_bytes=0", ranks=3, timeout=60)
    check_records(records, "hybcomm")
    rows = hybcomm_rows(out)
    assert [(r[0], r[1], r[2], r[3]) for r in rows] == [
        ("64x32", 4, 2, "ps"), ("64x32", 4, 2, "sfb"), ("64x32", 4, 2, "auto: sfb"),
        ("8x4", 16, 2, "ps"), ("8x4", 16, 2, "sfb"), ("8x4", 16, 2, "auto: ps")]
    for layer, k, workers, scheme, worker, worker_model, server, server_model, _, ratio in rows:
        d_in, d_out = map(int, layer.split("x"))
        # the counters, less the first pull, equal the cost model exactly, and the model is Poseidon's
        assert (worker, server) == (worker_model, server_model), (layer, scheme)
        cost = ps_bytes(d_out, d_in, workers) if scheme.endswith("ps") else sfb_bytes(d_out, d_in, k, workers)
        assert (worker, server) == (cost.worker, cost.server), (layer, scheme)
        assert ratio == 1.0 if scheme == "ps" else ratio > 0
    # every tensor (the head and the biases too) and the total, on every rank
    assert "counters against the model: equal in every run, on every rank" in out
    # the first pull taken off: the whole model (64x32 layer, 32x2 head, biases) once per worker
    assert f"64x32 {4 * (64 * 32 + 32 + 32 * 2 + 2):,} B" in out and f"8x4 {4 * (8 * 4 + 4 + 4 * 2 + 2):,} B" in out
    # records: sfb and auto against ps, per layer and number of workers
    assert [r["case"] for r in records] == ["BSP 64x32 K=4, 2 workers, sfb", "BSP 64x32 K=4, 2 workers, auto: sfb",
                                            "BSP 8x4 K=16, 2 workers, sfb", "BSP 8x4 K=16, 2 workers, auto: ps"]
    assert {r["reference"] for r in records} == {"ps, same layer and workers"}
    assert all(r["unit"] == "s" for r in records)
    crossover = out[out.index("crossover:"):]
    assert "64x32, K = 4: measured " in crossover and "P* = 10.67 nodes" in crossover
    assert "8x4, K = 16: measured " in crossover and "moves fewer bytes from none up to 2" in crossover
    # what auto planned from (bytes + the fixed cost its runs weighed, 0 here), and its score against time
    assert "auto, bytes + 0 B per SFB layer: SFB from 2 workers (K*_c = 28.4 at 2)" in crossover
    assert "auto, bytes + 0 B per SFB layer: SFB from none up to 2 (K*_c = 3.6 at 2)" in crossover
    assert "auto chose the scheme measured faster in " in crossover and " of 2 cases" in crossover


@pytest.mark.slow
def test_bsp_with_one_worker_trains_exactly_what_the_single_process_trainer_does(tmp_path):
    """The premise of ``bench overhead``: same model, batch and data, so the same arithmetic."""
    from ebsp_mpi.bench.overhead import JOB

    job = [o for o in JOB if not o.startswith("model.hidden")] + [
        "model.hidden=[32,16]", "data.synthetic_samples=600", "stop.iterations=25",
        "optim.weight_decay=1e-4", "optim.nesterov=true"]
    p = train(2, tmp_path / "mpi", *job, timeout=120)
    assert p.returncode == 0, p.stderr
    q = local(tmp_path / "local", *job, timeout=120)
    assert q.returncode == 0, q.stderr
    a, attrs_a = read_model(tmp_path / "mpi" / "model.h5")
    b, attrs_b = read_model(tmp_path / "local" / "model.h5")
    assert attrs_a["version"] == attrs_b["version"] == 25
    for name in a:
        np.testing.assert_array_equal(a[name], b[name], err_msg=name)
