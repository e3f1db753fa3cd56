"""``sweep``: the sweep file, checks before any run, commands, failures and timeouts, a real MPI sweep.

Most tests launch members with a fake launcher (a Python script given as --mpiexec) that writes a
summary.json, fails or hangs as told, so they need no MPI; one test runs a real two-member sweep
with ``mpiexec -n 3`` and analyses its outputs.
"""

import argparse
import json
import os
import shutil
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from ebsp_mpi import sweep as sw
from ebsp_mpi.errors import UsageError

REPO = Path(__file__).resolve().parent.parent
STRAGGLERS = REPO / "jobs" / "sweeps" / "stragglers.toml"

FAKE_LAUNCHER = textwrap.dedent('''
    """Stands in for mpiexec: reads --set and --out of the train command after it and acts on them."""
    import json, os, subprocess, sys, time
    args = sys.argv[1:]
    sets = [args[i + 1] for i, a in enumerate(args) if a == "--set"]
    out = args[args.index("--out") + 1]
    model = next((s.split("=", 1)[1] for s in sets if s.startswith("sync.model=")), "bsp").strip('"')
    seed = int(next((s.split("=", 1)[1] for s in sets if s.startswith("seed=")), "0"))
    print("fake launcher:", " ".join(args), flush=True)
    if model == "asp":
        print("boom: asp member failed on purpose", file=sys.stderr)
        sys.exit(3)
    if model == "ssp":  # hangs, with a child of its own, until the sweep's timeout ends them
        child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
        with open(out + ".pid", "w") as f:
            f.write(str(child.pid))
        time.sleep(120)
    os.makedirs(out)
    summary = {"sync": model, "workers": 2, "wall_seconds": 1.0, "test_accuracy": 0.9 + seed / 100,
               "test_loss": 0.1, "time_to_accuracy": {"0.9": 0.5 + seed / 10},
               "config": {"seed": seed, "sync": {"model": model}}}
    with open(os.path.join(out, "summary.json"), "w") as f:
        json.dump(summary, f)
''')


def write(path: Path, text: str) -> Path:
    path.write_text(textwrap.dedent(text))
    return path


def cli(argv, capsys=None):
    """Run ``sweep`` as the CLI does (cli.main: UsageError -> one line, exit 2)."""
    parser = argparse.ArgumentParser(prog="python -m ebsp_mpi")
    sw.add_parser(parser.add_subparsers(required=True))
    args = parser.parse_args(["sweep", *map(str, argv)])
    try:
        return args.run(args)
    except UsageError as err:
        print(f"ebsp_mpi: error: {err}", file=sys.stderr)
        return 2


@pytest.fixture
def fake(tmp_path):
    path = tmp_path / "fake_mpiexec.py"
    path.write_text(FAKE_LAUNCHER)
    return f"{sys.executable} {path}"


def small_sweep(tmp_path, members, seeds="[0, 1]", extra=""):
    body = "\n".join(f'[[member]]\nname = "{name}"\nset = ["sync.model={model}"]\n' for name, model in members)
    return write(tmp_path / "s.toml", f'name = "small"\nseeds = {seeds}\n{extra}\n{body}')


# -- the sweep file ------------------------------------------------------------------------------


def test_stragglers_sweep_has_five_models_over_three_seeds():
    s = sw.load_sweep(STRAGGLERS)
    assert len(s.members) == 15 and s.ranks == 5
    assert [m.name for m in s.members[:3]] == ["bsp-seed3", "bsp-seed4", "bsp-seed5"]
    assert {m.group for m in s.members} == {"bsp", "ssp-s3", "asp", "dssp", "elasticbsp"}
    ssp = next(m for m in s.members if m.name == "ssp-s3-seed5")
    assert ssp.overrides == ("sync.model=ssp", "sync.staleness=3", "optim.momentum=0.5", "seed=5")
    assert s.base == Path(os.path.normpath(STRAGGLERS.parent / "../stragglers/base.toml"))
    sw.check_members(s, 5)  # every member's job loads and fits 4 workers
    from ebsp_mpi.config import load_job

    job = load_job(str(s.base), ssp.overrides)
    assert job.straggler.slowdown == [1.0, 1.0, 1.0, 3.0] and job.straggler.jitter_sigma > 0
    assert job.sync.model == "ssp" and job.sync.staleness == 3 and job.seed == 5 and job.data.name == "digits"


def test_set_may_be_a_table_and_common_overrides_come_first(tmp_path):
    path = write(tmp_path / "t.toml", '''
        set = ["stop.iterations=5"]
        [[member]]
        name = "e"
        set = { sync = { model = "elasticbsp", lookahead = 4 }, straggler = { slowdown = [1.0, 2.0] } }
    ''')
    s = sw.load_sweep(path)
    assert s.name == "t" and s.base is None
    (m,) = s.members
    assert m.name == "e" and m.seed is None
    assert m.overrides == ("stop.iterations=5", 'sync.model="elasticbsp"', "sync.lookahead=4",
                           "straggler.slowdown=[1.0, 2.0]")
    from ebsp_mpi.config import load_job

    job = load_job(None, m.overrides)
    assert job.sync.model == "elasticbsp" and job.sync.lookahead == 4 and job.straggler.slowdown == [1.0, 2.0]


@pytest.mark.parametrize("text, words", [
    ('nmae = "x"\n[[member]]\nname = "a"', ["unknown key 'nmae'"]),
    ('name = "x"', ["member", "[[member]]"]),
    ('[[member]]\nset = []', ["member[0]", "name is missing"]),
    ('[[member]]\nname = "a b"', ["member[0].name", "'a b'"]),
    ('[[member]]\nname = "a"\n[[member]]\nname = "a"', ["member[1].name", "already exists"]),
    ('[[member]]\nname = "a"\nsets = []', ["member[0]", "unknown key 'sets'"]),
    ('[[member]]\nname = "a"\nset = "sync.model=asp"', ["member[0].set", "list"]),
    ('[[member]]\nname = "a"\nset = ["sync.model"]', ["member[0].set", "key=value"]),
    ('seeds = [1, 1]\n[[member]]\nname = "a"', ["seeds", "repeated"]),
    ('seeds = [0]\n[[member]]\nname = "a"\nset = ["seed=3"]', ["member[0].set", "seed"]),
    ('ranks = 1\n[[member]]\nname = "a"', ["ranks = 1", ">= 2"]),
    ('timeout_s = 0\n[[member]]\nname = "a"', ["timeout_s = 0"]),
    ('base = "nowhere.toml"\n[[member]]\nname = "a"', ["base", "nowhere.toml", "not found"]),
    ('[[member]\nname = "a"', ["not valid TOML"]),
])
def test_schema_errors_are_one_line_naming_the_key(tmp_path, capsys, text, words):
    path = write(tmp_path / "bad.toml", text)
    assert cli([path, "-n", "3", "--dry-run"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("ebsp_mpi: error: ") and str(path) in err
    for word in words:
        assert word in err


def test_every_member_is_checked_before_anything_runs(tmp_path, capsys, fake):
    path = write(tmp_path / "s.toml", '''
        [[member]]
        name = "good"
        set = ["sync.model=bsp"]
        [[member]]
        name = "typo"
        set = ["sync.modle=asp"]
    ''')
    out = tmp_path / "out"
    assert cli([path, "-n", "3", "--out", out, "--mpiexec", fake]) == 2
    err = capsys.readouterr().err
    assert "member 'typo'" in err and "sync.modle" in err and "did you mean 'sync.model'" in err
    assert not out.exists()  # the good member did not run either


def test_members_must_fit_the_ranks(tmp_path, capsys):
    assert cli([STRAGGLERS, "-n", "3", "--dry-run"]) == 2  # 2 workers, but slowdown names 4
    assert "straggler.slowdown" in capsys.readouterr().err


def test_ranks_come_from_n_or_the_file(tmp_path, capsys):
    path = small_sweep(tmp_path, [("b", "bsp")])
    assert cli([path, "--dry-run"]) == 2
    assert "-n N" in capsys.readouterr().err


# -- commands ------------------------------------------------------------------------------------


def test_dry_run_prints_one_mpiexec_command_per_member(tmp_path, capsys):
    out = tmp_path / "out"
    assert cli([STRAGGLERS, "-n", "5", "--out", out, "--dry-run", "--mpiexec", "mpirun --oversubscribe"]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert len(lines) == 15 and not out.exists()
    first = lines[0].split()
    assert first[:4] == ["mpirun", "--oversubscribe", "-n", "5"]
    assert first[4:8] == [sys.executable, "-m", "ebsp_mpi", "train"]
    assert first[8].endswith("jobs/stragglers/base.toml")
    assert first[-3:] == ["--out", str(out / "bsp-seed3"), "-q"]
    assert "--set sync.model=ssp --set sync.staleness=3 --set optim.momentum=0.5 --set seed=4" in lines[4]


def test_children_get_one_thread_unless_chosen():
    assert sw.child_env({"PATH": "/bin"})["OMP_NUM_THREADS"] == "1"
    assert sw.child_env({"OMP_NUM_THREADS": "8"})["OMP_NUM_THREADS"] == "8"
    assert sw.child_env({})["OPENBLAS_NUM_THREADS"] == "1"  # every BLAS pool, not only OpenMP's


# -- running -------------------------------------------------------------------------------------


def test_a_failed_member_is_reported_and_the_sweep_goes_on(tmp_path, capsys, fake):
    path = small_sweep(tmp_path, [("bsp", "bsp"), ("asp", "asp"), ("dssp", "dssp")])
    out = tmp_path / "out"
    assert cli([path, "-n", "3", "--out", out, "--mpiexec", fake, "--no-report"]) == 1
    text = capsys.readouterr().out
    progress = [ln for ln in text.splitlines() if ln.startswith("[")]
    assert len(progress) == 6
    assert "test accuracy 0.9100" in progress[1]  # bsp-seed1
    assert "FAILED (exit 3)" in progress[2] and "boom" in progress[2] and "asp-seed0.log" in progress[2]
    assert "dssp-seed1" in progress[5] and "test accuracy" in progress[5]  # it went on after the failure
    assert "4/6 members finished" in text and "failed: asp-seed0, asp-seed1" in text
    manifest = json.loads((out / "sweep.json").read_text())
    assert [m["status"] for m in manifest["members"]] == ["ok", "ok", "failed", "failed", "ok", "ok"]
    assert manifest["members"][2]["returncode"] == 3 and manifest["members"][2]["dir"] == "asp-seed0"
    assert "boom" in (out / "logs" / "asp-seed0.log").read_text()
    table = (out / "compare.md").read_text()
    assert "asp-seed0 | asp | 0 | failed" in table
    assert "| dssp | 2 |" in table  # the per-model medians are there for the members that ran


def test_a_member_past_its_timeout_is_ended_with_its_children(tmp_path, capsys, fake):
    path = small_sweep(tmp_path, [("ssp", "ssp"), ("bsp", "bsp")], seeds="[0]", extra="timeout_s = 2")
    out = tmp_path / "out"
    t0 = time.monotonic()
    assert cli([path, "-n", "3", "--out", out, "--mpiexec", fake, "--no-report"]) == 1
    assert time.monotonic() - t0 < 60
    text = capsys.readouterr().out
    assert "TIMEOUT" in text and "timeout_s = 2" in text
    child = int((out / "ssp-seed0.pid").read_text())
    for _ in range(50):  # the killed child may take a moment to be reaped by init
        if not _alive(child):
            break
        time.sleep(0.1)
    assert not _alive(child), "the member's child process outlived the timeout"
    assert json.loads((out / "sweep.json").read_text())["members"][1]["status"] == "ok"


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split()[2] != "Z"
    except FileNotFoundError:
        return False


def test_an_existing_sweep_directory_is_not_overwritten(tmp_path, capsys, fake):
    path = small_sweep(tmp_path, [("b", "bsp")])
    out = tmp_path / "out"
    out.mkdir()
    (out / "keep").write_text("earlier")
    assert cli([path, "-n", "3", "--out", out, "--mpiexec", fake]) == 2
    assert "not empty" in capsys.readouterr().err and (out / "keep").read_text() == "earlier"


def test_member_option_runs_one_member_into_a_shared_directory(tmp_path, capsys, fake):
    path = small_sweep(tmp_path, [("b", "bsp"), ("d", "dssp")])
    out = tmp_path / "out"
    assert cli([path, "-n", "3", "--out", out, "--mpiexec", fake, "--member", "3"]) == 0
    assert cli([path, "-n", "3", "--out", out, "--mpiexec", fake, "--member", "0"]) == 0
    assert sorted(p.name for p in out.iterdir() if p.is_dir()) == ["b-seed0", "d-seed1", "logs"]
    assert "[4/4] d-seed1" in capsys.readouterr().out
    # each task records its own member's outcome beside the other's; the members not run stay pending
    members = json.loads((out / "sweep.json").read_text())["members"]
    assert [m["status"] for m in members] == ["ok", "pending", "pending", "ok"]
    assert members[0]["returncode"] == 0 and members[3]["test_accuracy"] == pytest.approx(0.91)
    assert cli([path, "-n", "3", "--out", out, "--mpiexec", fake, "--member", "4"]) == 2
    assert "members 0..3" in capsys.readouterr().err


@pytest.mark.timeout(120)
def test_array_tasks_running_at_once_each_record_their_member(tmp_path, fake):
    """A Slurm array starts its tasks together: each reads, changes and writes sweep.json, one at a time."""
    path = small_sweep(tmp_path, [("b", "bsp"), ("d", "dssp"), ("a", "asp")], seeds="[0, 1, 2]")
    out = tmp_path / "out"
    tasks = [subprocess.Popen([sys.executable, "-m", "ebsp_mpi", "sweep", str(path), "-n", "3", "--out", str(out),
                               "--mpiexec", fake, "--member", str(k)], stdout=subprocess.DEVNULL,
                              stderr=subprocess.PIPE, text=True) for k in range(9)]
    codes = [t.wait(timeout=100) for t in tasks]
    assert codes == [0, 0, 0, 0, 0, 0, 1, 1, 1], [t.stderr.read() for t in tasks]  # the asp members fail
    members = json.loads((out / "sweep.json").read_text())["members"]
    assert [m["status"] for m in members] == ["ok"] * 6 + ["failed"] * 3
    assert not any("note:" in t.stderr.read() for t in tasks)


@pytest.mark.timeout(120)
@pytest.mark.skipif(shutil.which("mpiexec", path=str(Path(sys.executable).parent)) is None
                    and shutil.which("mpiexec") is None, reason="no mpiexec")
def test_real_sweep_with_mpiexec_then_report_and_perfetto(tmp_path, capsys):
    path = write(tmp_path / "real.toml", '''
        name = "real"
        set = ["stop.iterations=20", "stop.epochs=0", "eval.every_seconds=0.2", "straggler.slowdown=[1.0, 2.0]",
               "straggler.base_s=0.002"]
        timeout_s = 90
        [[member]]
        name = "bsp"
        set = ["sync.model=bsp"]
        [[member]]
        name = "elasticbsp"
        set = ["sync.model=elasticbsp", "sync.lookahead=3"]
    ''')
    out = tmp_path / "out"
    assert cli([path, "-n", "3", "--out", out, "--no-report"]) == 0, capsys.readouterr()
    for name in ("bsp", "elasticbsp"):
        summary = json.loads((out / name / "summary.json").read_text())
        assert summary["iterations"] == [20, 20] and summary["sync"] == name
        assert sorted(p.name for p in (out / name / "trace").iterdir()) == [
            "rank-0000.h5", "rank-0001.h5", "rank-0002.h5"]
    assert "| elasticbsp |" in (out / "compare.md").read_text()

    pytest.importorskip("pandas")
    pytest.importorskip("matplotlib")
    report = subprocess.run([sys.executable, "-m", "ebsp_mpi", "report", str(out), "--out",
                             str(tmp_path / "report")], capture_output=True, text=True, timeout=60)
    assert report.returncode == 0, report.stderr
    for name in ("accuracy.png", "timeline.png", "wait.png", "iterations.png", "staleness.png"):
        assert (tmp_path / "report" / name).stat().st_size > 10_000
    trace = subprocess.run([sys.executable, "-m", "ebsp_mpi", "timeline", str(out / "elasticbsp"),
                            "-o", str(tmp_path / "trace.json")], capture_output=True, text=True, timeout=60)
    assert trace.returncode == 0, trace.stderr
    with open(tmp_path / "trace.json") as f:
        events = json.load(f)["traceEvents"]
    assert all(all(k in e for k in ("ph", "ts", "pid", "tid")) for e in events)
    assert {e["pid"] for e in events} == {0, 1, 2}
    assert sum(1 for e in events if e["ph"] == "X" and e.get("cat") == "iteration") == 40


def test_the_cli_registers_sweep():
    """``python -m ebsp_mpi sweep`` once cli.py registers the subcommand (ebsp_mpi.sweep.add_parser)."""
    p = subprocess.run([sys.executable, "-m", "ebsp_mpi", "sweep", str(STRAGGLERS), "-n", "3", "--dry-run"],
                       capture_output=True, text=True, timeout=60)
    if "invalid choice" in p.stderr:
        pytest.skip("ebsp_mpi/cli.py does not register the sweep subcommand yet")
    assert p.returncode == 2 and p.stderr.count("\n") == 1 and "straggler.slowdown" in p.stderr


def test_seeds_option_replaces_the_files_seeds(tmp_path, capsys):
    import argparse

    from ebsp_mpi import sweep as sw

    parser = argparse.ArgumentParser()
    sw.add_parser(parser.add_subparsers())
    args = parser.parse_args(["sweep", str(STRAGGLERS), "-n", "5", "--seeds", "3-5,9", "--dry-run"])
    assert args.seeds == [3, 4, 5, 9]
    assert sw.main(args) == 0
    commands = capsys.readouterr().out.splitlines()
    assert len(commands) == 5 * 4 and all("seed=" in c for c in commands)
    assert len(sw.load_sweep(STRAGGLERS, seeds=[7]).members) == 5
    with pytest.raises(sw.SweepError, match="with --seeds: seeds = \\[1, 1\\]"):
        sw.load_sweep(STRAGGLERS, seeds=[1, 1])
