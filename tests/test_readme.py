"""Every command line in README.md's code blocks that needs no cluster runs as the README shows it.

The lines of the ``sh`` blocks run one after the other in a scratch directory that holds a copy of
``jobs/``, so that ``runs/...`` and ``plan.json`` land there. What a user would replace is replaced
(:data:`PLACEHOLDERS`), and runs are made short: a train run stops after a few iterations, the
simulation after a few pushes per worker, and the sweep's base job after one second instead of
eight (in the copy of ``jobs/``). Each must exit 0 and leave the outputs it names. A line that names
a run made by a later line (the analysis of the sweep) runs after it.

The ``$`` lines of the other blocks are the README's examples of bad input: each must print exactly
the lines shown below it, with exit code 2.

Not run here:

- the install-and-test lines (``python3 -m venv``, ``pip install``, ``pytest``): ``.ci/run`` runs them
  verbatim on a clean clone, which this test checks, and a test pass cannot start a fresh one;
- ``sbatch`` and ``srun`` lines: they need Slurm.

Every launch has a timeout, after which its whole process group is killed.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from mpirun import child_env, train_cmd

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
CI_RUN = ROOT / ".ci" / "run"

#: what a user replaces, as written in the README -> what the test gives; ``{sweep}`` is the sweep
#: directory that the README's sweep line made (its name has a time stamp)
PLACEHOLDERS = {
    "[JOB.toml] [--set ...]": "jobs/digits-cnn.toml --set sync.model=ssp",
    "JOB.toml": "jobs/digits-mlp.toml",
    "[--seeds 3-9]": "--seeds 3",  # one seed: 5 runs instead of the file's 15
    "runs/sweep-stragglers-<stamp>": "{sweep}",
    "runs/<run>": "runs/ssp",
}
#: a placeholder that no entry of PLACEHOLDERS replaced
UNRESOLVED = re.compile(r"<[a-z]+>|\[-|\[[A-Z]|\.\.\.")
#: iterations per worker of each train run (a resumed run: twice as many, in all)
ITERATIONS = 4
#: pushes per worker of the simulation, instead of the README's 500 (the trace files of 1,024
#: workers are most of its time either way)
SIM_ITERATIONS = 20
#: the sweep's base job, and its wall-time limit in the copy (the README's sweep: 5 runs of it)
SWEEP_BASE, SWEEP_SECONDS = "jobs/stragglers/base.toml", "seconds = 1.0"
#: seconds a launch may take (a 5-rank run on 2 shared cores takes 10-20 s; the sweep 5 of them)
TIMEOUT_S = {"sweep": 600, "mpiexec": 300}
TIMEOUT_OTHER_S = 180


# -- reading the README ------------------------------------------------------------------------------


def code_blocks(text: str) -> list[tuple[str, list[str]]]:
    """(language, lines) of each fenced block, in order; the fences may be indented (in a list)."""
    blocks, lang, lines = [], None, []
    for line in text.splitlines():
        fence = line.strip().startswith("```")
        if fence and lang is None:
            lang, lines = line.strip()[3:].strip(), []
        elif fence:
            blocks.append((lang, lines))
            lang = None
        elif lang is not None:
            lines.append(line.strip())
    assert lang is None, "README.md: a code block is not closed"
    return blocks


def shell_lines(lines: list[str]) -> list[str]:
    """The command lines of an ``sh`` block, with backslash continuations joined."""
    out, pending = [], ""
    for line in lines:
        if line.endswith("\\"):
            pending += line[:-1].strip() + " "
            continue
        line, pending = pending + line, ""
        if line and not line.startswith("#"):
            out.append(line)
    return out


def error_examples(lines: list[str]) -> list[tuple[str, list[str]]]:
    """(command, the output lines shown after it) for each ``$ `` line of a block."""
    examples = []
    for line in lines:
        if line.startswith("$ "):
            examples.append((line[2:], []))
        elif examples:
            examples[-1][1].append(line)
    return examples


def readme_commands() -> tuple[list[str], list[tuple[str, list[str]]]]:
    """Every command line of the ``sh`` blocks, and every ``$`` example of the others."""
    commands, examples = [], []
    for lang, lines in code_blocks(README.read_text(encoding="utf-8")):
        if lang == "sh":
            commands += shell_lines(lines)
        else:
            examples += error_examples(lines)
    return commands, examples


def why_not_run(line: str) -> str | None:
    """The reason a README line is left out (see the module docstring), or None."""
    if any(part in line for part in ("python3 -m venv", "pip install", "pytest")):
        return ".ci/run"
    if line.startswith(". .venv/bin/activate"):
        return "the tests run the venv's python and mpiexec already"
    if shlex.split(line, comments=True)[0] in ("sbatch", "srun"):
        return "Slurm"
    return None


COMMANDS, EXAMPLES = readme_commands()
RUN = [c for c in COMMANDS if why_not_run(c) is None]
# a line that reads the sweep runs after the sweep; otherwise the README's order
RUN.sort(key=lambda c: "<stamp>" in c)


# -- the scratch directory ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def workdir(tmp_path_factory) -> Path:
    """A scratch directory with a copy of ``jobs/`` in which the sweep's base job runs 1 s."""
    work = tmp_path_factory.mktemp("readme")
    shutil.copytree(ROOT / "jobs", work / "jobs")
    base = work / SWEEP_BASE
    text = base.read_text()
    assert text.count("seconds = 8.0") == 1, f"{SWEEP_BASE}: expected its stop.seconds = 8.0 to shorten"
    base.write_text(text.replace("seconds = 8.0", SWEEP_SECONDS))
    return work


def run_argv(argv: list[str], cwd: Path, timeout: float) -> subprocess.CompletedProcess:
    """Run `argv` in `cwd`; on a timeout kill its whole process group (mpiexec and its ranks) and fail."""
    proc = subprocess.Popen(argv, cwd=cwd, env=child_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        pytest.fail(f"{shlex.join(argv)} did not finish in {timeout} s:\n{out[-3000:]}\n{err[-3000:]}")
    return subprocess.CompletedProcess(argv, proc.returncode, out, err)


def subcommand(argv: list[str]) -> str:
    """The ``ebsp_mpi`` subcommand of a command line (``train``, ``simulate``, ...)."""
    return argv[argv.index("ebsp_mpi") + 1]


def launcher(ranks: int) -> list[str]:
    """``mpiexec`` with the flags the other tests launch `ranks` ranks with (``mpirun.train_cmd``), up
    to its ``-n``."""
    cmd = train_cmd(ranks, "unused")
    return cmd[:cmd.index("-n")]


def to_argv(line: str, workdir: Path) -> list[str]:
    """The README `line` as the test runs it: placeholders replaced, this Python and this launcher,
    short runs (see the module docstring)."""
    for placeholder, value in PLACEHOLDERS.items():
        if placeholder in line:
            if "{sweep}" in value:
                sweeps = sorted((workdir / "runs").glob("sweep-stragglers-*"))
                assert len(sweeps) == 1, f"the README's sweep line made {len(sweeps)} sweep directories"
                value = value.format(sweep=sweeps[0].relative_to(workdir))
            line = line.replace(placeholder, value)
    assert not UNRESOLVED.search(line), f"a placeholder that PLACEHOLDERS does not replace: {line}"
    argv = shlex.split(line, comments=True)
    if argv[0] == "mpiexec":
        n = argv.index("-n")
        argv = [*launcher(int(argv[n + 1])), *argv[n:]]
    argv = [sys.executable if a == "python" else a for a in argv]
    sub = subcommand(argv)
    if sub == "train":
        stop = 2 * ITERATIONS if "--resume" in argv else ITERATIONS
        argv += ["--set", f"stop.iterations={stop}", "-q"]
    elif sub == "simulate":
        if "--train" not in argv:  # a --train run is short already, and must run long enough to learn
            argv[argv.index("--iterations") + 1] = str(SIM_ITERATIONS)
        argv.append("-q")
    return argv


def new_run(workdir: Path, before: set[Path]) -> Path:
    made = sorted(set((workdir / "runs").glob("*")) - before)
    assert len(made) == 1, f"expected one new directory in runs/, got {made}"
    return made[0]


# -- the tests ---------------------------------------------------------------------------------------


def test_the_readme_has_commands_to_run_and_every_placeholder_is_in_it():
    """The parsing finds what the README shows, and PLACEHOLDERS holds nothing stale."""
    assert len(RUN) >= 10 and all("ebsp_mpi" in c for c in RUN), RUN
    assert sum("python -m ebsp_mpi sweep" in c for c in RUN) == 1
    for placeholder in PLACEHOLDERS:
        assert any(placeholder in c for c in RUN), f"{placeholder!r} is no longer in README.md"
    assert len(EXAMPLES) >= 1 and all(output for _, output in EXAMPLES)


def test_the_lines_left_out_are_the_ones_ci_runs_verbatim():
    ci = CI_RUN.read_text()
    skipped = [c for c in COMMANDS if why_not_run(c) == ".ci/run"]
    assert len(skipped) == 2
    for line in skipped:
        assert line in ci, f".ci/run does not run the README's line: {line}"


@pytest.mark.parametrize("line", RUN, ids=[f"{i}-{subcommand(shlex.split(c, True))}" for i, c in enumerate(RUN)])
def test_a_readme_line_runs(line, workdir):
    argv = to_argv(line, workdir)
    sub = subcommand(argv)
    timeout = TIMEOUT_S.get(sub, TIMEOUT_S["mpiexec"] if line.startswith("mpiexec") else TIMEOUT_OTHER_S)
    (workdir / "runs").mkdir(exist_ok=True)
    before = set((workdir / "runs").glob("*"))
    p = run_argv(argv, workdir, timeout)
    assert p.returncode == 0, f"{shlex.join(argv)}\n{p.stdout[-3000:]}\n{p.stderr[-3000:]}"

    named = [argv[i + 1] for i, a in enumerate(argv[:-1]) if a in ("--out", "-o")]
    for path in named:
        assert (workdir / path).exists(), f"{line}: wrote no {path}"
    if sub in ("train", "simulate"):
        if "--resume" in argv:
            run = workdir / argv[argv.index("--resume") + 1]
        else:
            run = workdir / named[0] if named else new_run(workdir, before)
        summary = json.loads((run / "summary.json").read_text())
        expected = int(argv[argv.index("--iterations") + 1]) if sub == "simulate" else \
            2 * ITERATIONS if "--resume" in argv else ITERATIONS
        assert summary["iterations"] == [expected] * summary["workers"], summary["iterations"]
        shows_what_it_is_for(line, summary)
        if summary["world_size"] > 1:  # the single-process trainer writes no trace
            assert (run / "trace" / f"rank-{summary['world_size'] - 1:04d}.h5").is_file()
        if sub == "train" or "--train" in argv:  # real weights: a model, and its accuracy
            assert (run / "model.h5").is_file() and 0 < summary["test_accuracy"] <= 1
    elif sub == "sweep":
        sweep = new_run(workdir, before)
        status = [m["status"] for m in json.loads((sweep / "sweep.json").read_text())["members"]]
        assert status == ["ok"] * 5 and (sweep / "compare.md").is_file(), status
    elif sub == "plan":
        assert json.loads((workdir / "plan.json").read_text())
    elif sub == "report":
        assert (workdir / named[0] / "report.md").is_file()
    elif sub == "timeline":
        assert json.loads((workdir / named[0]).read_text())["traceEvents"]
    else:  # config, compare: they print
        assert p.stdout.strip()


def shows_what_it_is_for(line: str, summary: dict) -> None:
    """A simulation of ElasticBSP has stragglers to wait for (its wait is above zero), and a simulation
    with real weights learns (test accuracy well above the digits' chance of 0.1)."""
    if "simulate" in line and "elasticbsp" in line:
        assert sum(summary["wait_seconds"]) > 0, f"{line}: no worker waited"
    if "simulate" in line and "--train" in line:
        assert summary["test_accuracy"] > 0.5, f"{line}: did not learn: {summary['test_accuracy']}"


def test_the_running_jobs_block_starts_in_the_venv_of_the_install_line():
    """A bare ``python`` there has h5py and mpi4py only in the venv that command 1 makes."""
    first = next(c for c in COMMANDS if why_not_run(c) is None)
    activate = COMMANDS[COMMANDS.index(first) - 1]
    assert activate.startswith(". .venv/bin/activate"), activate
    assert "python3 -m venv .venv " in COMMANDS[0], COMMANDS[0]


@pytest.mark.parametrize("line, output", EXAMPLES, ids=[c for c, _ in EXAMPLES])
def test_a_readme_error_example_prints_what_the_readme_shows(line, output, workdir):
    argv = [sys.executable if a == "python" else a for a in shlex.split(line)]
    p = run_argv(argv, workdir, TIMEOUT_OTHER_S)
    assert p.returncode == 2 and p.stderr.strip().splitlines() == output, p.stderr
