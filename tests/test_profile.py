"""``profile`` and ``plan JOB``: a profile of a small job, network figures from bench mpi, plans written and
read back by the job that names them, and one-line errors."""

from __future__ import annotations

import json

import pytest

from ebsp_mpi import build
from ebsp_mpi.cli import main
from ebsp_mpi.config import load_job
from ebsp_mpi.run_description import describe, read_osdp_plan
from ebsp_mpi.plan.osdp_files import (PLAN_FORMAT, VERSION, OsdpFileError, model_layers, network_from_bench, read_plan,
                                      read_profile)
from cliutil import one_line_error

JOB = ["--set", "data.name=synthetic", "--set", "data.synthetic_samples=200", "--set", "model.hidden=[48,48]",
       "--set", "data.batch_size=8"]
QUICK = ["--reps", "2", "--warmup", "1", "-q"]


def job_of(*overrides):
    """The job that ``JOB`` plus `overrides` (``--set`` pairs) describe."""
    pairs = [*JOB, *overrides]
    return load_job(None, [v for k, v in zip(pairs[::2], pairs[1::2], strict=True) if k == "--set"])


@pytest.fixture(scope="module")
def profile_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("profile") / "profile.json"
    assert main(["profile", *JOB, *QUICK, "--batch-sizes", "8,16", "--latency", "2e-5", "--bandwidth", "2GB/s",
                 "--out", str(path)]) == 0
    return path


def test_profile_describes_the_jobs_model(profile_file):
    doc = read_profile(profile_file)
    job = job_of()
    layers = model_layers(build.model(job, build.dataset(job)))
    assert [(e["name"], e["params"]) for e in doc["layers"]] == [(e["name"], e["params"]) for e in layers]
    assert doc["batch_sizes"] == [8, 16]
    dense = [e for e in doc["layers"] if e["params"]]
    assert [e["rows"] for e in dense] == [64, 48, 48] and dense[0]["row_elems"] == 48
    assert all(t > 0 for e in dense for t in e["forward_s"] + e["backward_s"])
    # each layer in 2, 4 and 8 slices (every layer has more rows than 8), timed per batch size
    assert doc["splits"] == [2, 4, 8] and all(sorted(e["slices_s"]) == ["2", "4", "8"] for e in dense)
    assert all(len(t["forward_s"]) == len(t["backward_s"]) == 2 and min(t["forward_s"] + t["backward_s"]) > 0
               for e in dense for t in e["slices_s"].values())
    # a step at batch 16 holds more than at batch 8 (the minibatch and every activation double)
    assert 0 < doc["activation_bytes"][0] < doc["activation_bytes"][1]
    assert doc["network"] == {"latency_s": 2e-5, "bandwidth_bytes_per_s": 2e9, "source": "options", "overlap": False}


def bench_records(tmp_path):
    records = []
    for size, label, one_way in ((4096, "4 KiB", 3e-6), (1 << 20, "1 MiB", 2e-4), (64 << 20, "64 MiB", 1e-2)):
        records.append({"kind": "mpi", "case": f"bandwidth {label}", "figure": size / one_way, "unit": "B/s",
                        "reference": "memory copy", "reference_figure": 1.0, "ratio": 1.0})
        records.append({"kind": "mpi", "case": f"latency {label}", "figure": one_way, "unit": "s",
                        "reference": "memory copy", "reference_figure": 1.0, "ratio": 1.0})
    path = tmp_path / "mpi.json"
    path.write_text(json.dumps(records))
    return path


def test_network_from_bench_mpi(tmp_path):
    out = tmp_path / "p.json"
    assert main(["profile", *JOB, *QUICK, "--bench", str(bench_records(tmp_path)), "--out", str(out)]) == 0
    net = read_profile(out)["network"]
    # latency: the smallest message's one-way time; bandwidth: the largest message's (no cold records)
    assert net["latency_s"] == 3e-6 and net["bandwidth_bytes_per_s"] == (64 << 20) / 1e-2
    assert net["source"].startswith("bench mpi")
    # with cold records (bench mpi writes them from 256 KiB): their median bandwidth
    path = bench_records(tmp_path)
    records = json.loads(path.read_text())
    records += [{"kind": "mpi", "case": f"cold bandwidth {label}", "figure": figure, "unit": "B/s",
                 "reference": "from cache", "reference_figure": 1.0, "ratio": figure}
                for label, figure in (("1 MiB", 4e9), ("4 MiB", 5e9), ("64 MiB", 7e9))]
    path.write_text(json.dumps(records))
    assert network_from_bench(path) == (3e-6, 5e9)


def test_plan_from_profile_is_what_the_job_reads(profile_file, tmp_path, capsys):
    plan = tmp_path / "plan.json"
    assert main(["plan", *JOB, "--profile", str(profile_file), "--batch-sizes", "8", "--memory-limit", "1GiB",
                 "--out", str(plan)]) == 0
    out = capsys.readouterr().out
    assert "all-resident" in out and "predicted peak memory" in out
    doc = read_plan(plan)
    assert doc["batch_size"] == 8 and all(e["mode"] == "resident" for e in doc["layers"])
    job = job_of("--set", f"osdp.plan={plan}")
    assert describe(job, 1, read_osdp_plan(job)).plan_doc["layers"] == doc["layers"]

    # --latency alone replaces the profile's latency and keeps its measured bandwidth
    fast = tmp_path / "latency.json"
    assert main(["plan", *JOB, "--profile", str(profile_file), "--batch-sizes", "8", "--memory-limit", "1GiB",
                 "--latency", "3e-4", "--out", str(fast)]) == 0
    net, profiled = read_plan(fast)["network"], read_profile(profile_file)["network"]
    assert net["latency_s"] == 3e-4 and net["bandwidth_bytes_per_s"] == profiled["bandwidth_bytes_per_s"]

    # one byte under all-resident's peak: some layer must leave the worker
    tight = tmp_path / "tight.json"
    assert main(["plan", *JOB, "--profile", str(profile_file), "--batch-sizes", "8", "--memory-limit",
                 str(doc["predicted"]["peak_bytes"] - 1), "--out", str(tight)]) == 0
    layers = read_plan(tight)["layers"]
    assert any(e["mode"] == "on-demand" for e in layers)
    assert all(sum(e["slice_rows"]) == e_rows for e, e_rows in zip(layers, (64, 48, 48), strict=True)
               if e["mode"] == "on-demand")


@pytest.mark.parametrize("args, words", [
    (["--bench", "x.json", "--latency", "1e-6"], ["not both"]),
    (["--bandwidth", "fast"], ["--bandwidth", "per second"]),
    (["--latency", "-1"], ["--latency"]),
    (["--batch-sizes", "8,x"], ["--batch-sizes"]),
    (["--bench", "/no/such/mpi.json"], ["/no/such/mpi.json", "not found"]),
    (["--reps", "0"], ["--reps"]),
    (["--splits", "1,2"], ["--splits", ">= 2"]),
    (["--splits", "two"], ["--splits"]),
])
def test_profile_errors(capsys, tmp_path, args, words):
    line = one_line_error(capsys, ["profile", *JOB, "-q", "--out", str(tmp_path / "p.json"), *args])
    for word in words:
        assert word in line


def test_bench_file_without_mpi_records(capsys, tmp_path):
    path = tmp_path / "other.json"
    path.write_text(json.dumps([{"kind": "ps", "case": "round trip", "figure": 1.0}]))
    assert "bench mpi" in one_line_error(capsys, ["profile", *JOB, "-q", "--bench", str(path),
                                                  "--out", str(tmp_path / "p.json")])


def test_plan_errors(capsys, tmp_path, profile_file):
    other = ["--set", "model.hidden=[16]"]
    line = one_line_error(capsys, ["plan", *JOB, *other, "--profile", str(profile_file), "--memory-limit", "1GB"])
    assert "profiled on layers" in line
    line = one_line_error(capsys, ["plan", *JOB, "--profile", str(profile_file), "--batch-sizes", "32",
                                   "--memory-limit", "1GB"])
    assert "--batch-sizes" in line and "8,16" in line
    line = one_line_error(capsys, ["plan", *JOB, "--profile", str(profile_file), "--memory-limit", "2k"])
    assert "smallest limit that fits" in line
    not_profile = tmp_path / "x.json"
    not_profile.write_text("{}")
    assert "not an OSDP profile" in one_line_error(capsys, ["plan", *JOB, "--profile", str(not_profile),
                                                            "--memory-limit", "1GB"])
    old = tmp_path / "old.json"  # version 1 had no input_grad_elems: planning with it would undercount the peak
    old.write_text(json.dumps({**json.loads(profile_file.read_text()), "version": 1}))
    line = one_line_error(capsys, ["plan", *JOB, "--profile", str(old), "--memory-limit", "1GB"])
    assert "version 1" in line and "write it again" in line
    # slice counts the profile has no times for: profile them, not guess them
    line = one_line_error(capsys, ["plan", *JOB, "--profile", str(profile_file), "--memory-limit", "1GB",
                                   "--splits", "2,3"])
    assert "no times for layers in 3 slices" in line and "--splits 2,3" in line
    missing = json.loads(profile_file.read_text())
    del missing["layers"][1]["slices_s"]["4"]
    (tmp_path / "missing.json").write_text(json.dumps(missing))
    line = one_line_error(capsys, ["plan", *JOB, "--profile", str(tmp_path / "missing.json"), "--memory-limit", "1GB"])
    assert "needs slices_s" in line


def test_job_naming_a_bad_plan(capsys, tmp_path):
    bad = tmp_path / "plan.json"
    bad.write_text(json.dumps({"format": "something else"}))
    job = job_of("--set", f"osdp.plan={bad}")
    with pytest.raises(OsdpFileError, match="not an OSDP plan"):
        read_osdp_plan(job)
    line = one_line_error(capsys, ["train", *JOB, "--set", f"osdp.plan={tmp_path / 'none.json'}",
                                   "--set", "stop.iterations=1", "-q", "--out", str(tmp_path / "run")])
    assert "osdp.plan" in line and "not found" in line


def test_memory_limit_stops_a_run_that_needs_more(capsys, tmp_path, profile_file):
    job = job_of()
    weights = build.model(job, build.dataset(job)).space.nbytes
    run = ["train", *JOB, "--set", "stop.iterations=1", "-q"]
    line = one_line_error(capsys, [*run, "--set", f"osdp.memory_limit={2 * weights - 1}",
                                   "--out", str(tmp_path / "r1")])
    assert "every layer resident needs at least" in line and "python -m ebsp_mpi plan" in line
    assert not (tmp_path / "r1").exists()
    # a plan under the limit passes the check; the same plan under a smaller limit does not
    plan = tmp_path / "plan.json"
    limit = 2 * weights - 1 + 10**6
    assert main(["plan", *JOB, "--profile", str(profile_file), "--batch-sizes", "8", "--memory-limit", str(limit),
                 "--out", str(plan)]) == 0
    peak = read_plan(plan)["predicted"]["peak_bytes"]
    ok = job_of("--set", f"osdp.plan={plan}", "--set", f"osdp.memory_limit={peak}")
    describe(ok, 1, read_osdp_plan(ok))
    line = one_line_error(capsys, [*run, "--set", f"osdp.plan={plan}", "--set", f"osdp.memory_limit={peak - 1}",
                                   "--out", str(tmp_path / "r2")])
    assert "predicts a peak of" in line
    assert "osdp.memory_limit" in one_line_error(capsys, [*run, "--set", "osdp.memory_limit=lots",
                                                          "--out", str(tmp_path / "r3")])



@pytest.mark.parametrize("command", [["profile"], ["plan", "--memory-limit", "1GB"]])
def test_a_batch_size_no_memory_holds_is_one_line(capsys, tmp_path, command):
    """10**8 samples of the digits (64 values each) need tens of GiB before any layer runs."""
    line = one_line_error(capsys, [*command, *JOB, "-q", "--out", str(tmp_path / "out.json"),
                                   "--batch-sizes", "8,100000000"])
    assert "--batch-sizes 8,100000000: a step at batch 100000000 needs at least" in line
    assert "GiB" in line and "memory" in line


@pytest.mark.parametrize("key, value, words", [
    ("slice_rows", ["a", "b", "c", "d"], "needs slice_rows, one integer >= 1 per slice"),
    ("slice_rows", [16.0, 16.0, 16.0, 16.0], "needs slice_rows, one integer >= 1 per slice"),
    ("slice_rows", [None, None, None, None], "needs slice_rows, one integer >= 1 per slice"),
    ("slice_rows", [True, 31, 16, 16], "needs slice_rows, one integer >= 1 per slice"),
    ("slice_rows", "64", "needs slice_rows, one integer >= 1 per slice"),
    ("tensors", None, "needs tensors, a list of tensor names"),
    ("buffer_bytes", "4096", "buffer_bytes must be an integer >= 0"),
    ("predicted", {"peak_bytes": "lots"}, "predicted must hold numbers >= 0"),
])
def test_a_plan_file_with_values_of_the_wrong_type_is_one_line(capsys, tmp_path, key, value, words):
    """Each value a worker computes with is checked when the plan is read: a string, a float or null
    where a count belongs would otherwise end the run in a traceback (a TypeError in sum())."""
    plan = {"format": PLAN_FORMAT, "version": VERSION, "batch_size": 8, "buffer_bytes": 8192,
            "predicted": {"peak_bytes": 1000, "iteration_s": 0.001, "samples_per_s": 8000.0},
            "layers": [{"name": "dense1", "tensors": ["dense1.W", "dense1.b"], "params": 64 * 48 + 48,
                        "mode": "on-demand", "slices": 4, "slice_rows": [16, 16, 16, 16]}]}
    if key in ("buffer_bytes", "predicted"):
        plan[key] = value
    else:
        plan["layers"][0][key] = value
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(plan))
    with pytest.raises(OsdpFileError, match=words):
        read_plan(path)
    line = one_line_error(capsys, ["train", *JOB, "--set", f"osdp.plan={path}", "--set", "stop.iterations=1", "-q",
                                   "--out", str(tmp_path / "run")])
    assert words in line and str(path) in line
