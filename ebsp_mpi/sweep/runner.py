"""Running a sweep's members one after the other under mpiexec, each with a timeout and a log;
then the comparison and figures."""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shlex
import signal
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from ..config import load_job
from ..runtime.transport.env import cap_blas_threads, launch_command, launch_env
from ..safe_text import clean_tree, path_label
from .spec import Member, Sweep

MANIFEST = "sweep.json"
#: seconds between SIGTERM and SIGKILL of a member that ran out of time
_KILL_GRACE_S = 10.0

def member_command(sweep: Sweep, member: Member, ranks: int, run_dir: Path, mpiexec: list[str],
                   wrapper: list[str] = ()) -> list[str]:
    """``MPIEXEC [FLAGS] -n N [WRAPPER] python -m ebsp_mpi train [BASE] --set ... --out RUN_DIR -q``, with
    the flags the launcher needs (Open MPI's ``--oversubscribe`` where ranks outnumber cores:
    ``runtime.transport.env.launch_flags``)."""
    cmd = [*launch_command(mpiexec, ranks), *wrapper, sys.executable, "-m", "ebsp_mpi", "train"]
    if sweep.base:
        cmd.append(str(sweep.base))
    for override in member.overrides:
        cmd += ["--set", override]
    return cmd + ["--out", str(run_dir), "-q"]


def child_env(env=None) -> dict:
    """The members' environment: one OpenMP/BLAS thread per rank unless the caller chose a number
    (ranks share the cores; on Slurm the scripts export ``OMP_NUM_THREADS=$SLURM_CPUS_PER_TASK``)."""
    return cap_blas_threads(dict(os.environ if env is None else env))


# -- running -------------------------------------------------------------------------------------


@dataclass
class Outcome:
    """What became of one member: ``status`` is ``ok``, ``failed``, ``timeout``, ``pending`` or (a Slurm
    array task's member, while it runs) ``running``.

    ``dir`` is the member's run directory relative to the sweep directory (so the sweep can move).
    """

    name: str
    group: str
    seed: int | None
    dir: str
    command: list
    overrides: list
    status: str = "pending"
    returncode: int | None = None
    seconds: float | None = None
    test_accuracy: float | None = None
    message: str = ""


def _stop(proc: subprocess.Popen) -> None:
    """End a member's process group (mpiexec and the ranks it started), politely first."""
    for sig, grace in ((signal.SIGTERM, _KILL_GRACE_S), (signal.SIGKILL, 5.0)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=grace)
            return
        except subprocess.TimeoutExpired:
            continue


def _last_line(log: Path) -> str:
    try:
        lines = [ln.strip() for ln in log.read_text(errors="replace").splitlines() if ln.strip()]
    except OSError:
        return ""
    return lines[-1][:300] if lines else ""


def run_member(outcome: Outcome, run_dir: Path, log: Path, timeout_s: float, env: dict) -> Outcome:
    """Run one member into ``run_dir``, its output to ``log``; fill in and return ``outcome``."""
    log.parent.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()
    with log.open("w") as f:
        f.write("$ " + shlex.join(outcome.command) + "\n")
        f.flush()
        # a process group of its own, so that a timeout can end mpiexec and every rank it started
        proc = subprocess.Popen(outcome.command, stdout=f, stderr=subprocess.STDOUT, env=env,
                                start_new_session=True)
        try:
            outcome.returncode = proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            _stop(proc)
            outcome.returncode = proc.returncode
            outcome.status = "timeout"
        except BaseException:
            _stop(proc)
            raise
    outcome.seconds = time.monotonic() - t0
    summary = run_dir / "summary.json"
    if outcome.status != "timeout" and outcome.returncode == 0 and summary.is_file():
        try:
            outcome.test_accuracy = json.loads(summary.read_text()).get("test_accuracy")
            outcome.status = "ok"
        except (OSError, ValueError) as err:
            outcome.status, outcome.message = "failed", f"{summary}: unreadable ({err})"
    elif outcome.status == "timeout":
        outcome.message = f"stopped after timeout_s = {timeout_s:g} s"
    else:
        outcome.status = "failed"
        outcome.message = _last_line(log) or f"exit code {outcome.returncode}, no summary.json"
    return outcome


def progress_line(i: int, total: int, o: Outcome, log: Path) -> str:
    head = f"[{i:>{len(str(total))}}/{total}] {o.name:<24} {o.seconds:7.1f} s"
    if o.status == "ok":
        acc = "?" if o.test_accuracy is None else f"{o.test_accuracy:.4f}"
        return f"{head}  test accuracy {acc}"
    what = "TIMEOUT" if o.status == "timeout" else f"FAILED (exit {o.returncode})"
    return f"{head}  {what}: {o.message}  [log: {log}]"


def write_manifest(out: Path, sweep: Sweep, ranks: int, outcomes: list[Outcome]) -> Path:
    """``OUT/sweep.json``: the sweep, and per member its directory, command and outcome (atomic write)."""
    path = out / MANIFEST
    doc = {"name": sweep.name, "file": str(sweep.path), "base": str(sweep.base) if sweep.base else None,
           "ranks": ranks, "timeout_s": sweep.timeout_s, "members": [asdict(o) for o in outcomes]}
    # one temporary file per process: a Slurm array runs its members at once, each writing the manifest
    tmp = path.with_suffix(f".json.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(clean_tree(doc), indent=2) + "\n")  # a log line or a path may hold anything
    os.replace(tmp, path)
    return path


@contextlib.contextmanager
def _manifest_lock(out: Path):
    """The sweep directory's manifest, held by this process alone: the tasks of a Slurm array each run
    one member at once and record its outcome in the same ``sweep.json`` (read, changed, written)."""
    with (out / f".{MANIFEST}.lock").open("a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
        yield


def record_member(out: Path, sweep: Sweep, ranks: int, outcomes: list[Outcome], i: int) -> None:
    """Record member `i`'s outcome in ``OUT/sweep.json`` beside what the other members' tasks recorded
    (the manifest is written first if no task has yet). A file system that cannot lock is one line
    saying so: the member's log and run directory still say how it went."""
    try:
        with _manifest_lock(out):
            path = out / MANIFEST
            recorded = [Outcome(**m) for m in json.loads(path.read_text())["members"]] if path.exists() else outcomes
            if [o.name for o in recorded] != [o.name for o in outcomes]:
                raise ValueError(f"{path} lists other members than {sweep.path}")
            recorded[i] = outcomes[i]
            write_manifest(out, sweep, ranks, recorded)
    except (OSError, ValueError, TypeError, KeyError) as err:
        print(f"sweep: note: {outcomes[i].name}'s outcome ({outcomes[i].status}) is not in {out / MANIFEST}: "
              f"{err}", file=sys.stderr, flush=True)


def plan(sweep: Sweep, ranks: int, out: Path, mpiexec: list[str], wrapper: list[str] = ()) -> list[Outcome]:
    return [Outcome(name=m.name, group=m.group, seed=m.seed, dir=m.name,
                    command=member_command(sweep, m, ranks, out / m.name, mpiexec, wrapper),
                    overrides=list(m.overrides))
            for m in sweep.members]


def default_out(sweep: Sweep) -> Path:
    return Path("runs") / f"sweep-{path_label(sweep.name)}-{time.strftime('%Y%m%d-%H%M%S', time.gmtime())}"


def run_sweep(sweep: Sweep, ranks: int, out: Path, mpiexec: list[str], *, wrapper: list[str] = (),
              only: int | None = None, print=print) -> list[Outcome]:
    """Run the members (all, or only index ``only``) one after the other; returns their outcomes.

    The manifest is rewritten after each member, so an interrupted sweep still records what ran. With
    `only` (a Slurm array task), the member is ``running`` in it, then its outcome, beside the other
    tasks' members (:func:`record_member`).
    """
    outcomes = plan(sweep, ranks, out, mpiexec, wrapper)
    chosen = range(len(outcomes)) if only is None else [only]
    out.mkdir(parents=True, exist_ok=True)
    if only is None:
        write_manifest(out, sweep, ranks, outcomes)
    else:
        outcomes[only].status = "running"
        record_member(out, sweep, ranks, outcomes, only)
    env = launch_env(mpiexec, child_env())  # Open MPI's launcher run as root needs its permission
    for i in chosen:
        o = outcomes[i]
        log = out / "logs" / f"{o.name}.log"
        # the member's server ranks, for slurm/gpu-bind.sh (which keeps them off the GPUs)
        member_env = {**env, "EBSP_SERVERS": str(load_job(sweep.base, sweep.members[i].overrides).runtime.servers)}
        run_member(o, out / o.dir, log, sweep.timeout_s, member_env)
        print(progress_line(i + 1, len(outcomes), o, log), flush=True)
        if only is None:
            write_manifest(out, sweep, ranks, outcomes)
        else:
            record_member(out, sweep, ranks, outcomes, only)
    return [outcomes[i] for i in chosen]


def write_comparison(out: Path, print=print) -> list[Path]:
    """The comparison of the sweep's members (``compare.md``, CSV files), printed as Markdown too."""
    from ..analysis import compare
    from ..analysis.runs import load_infos

    cmp = compare.compare(load_infos([out]))
    files = compare.write(cmp, out)
    print("\n" + compare.to_markdown(cmp), flush=True)
    return files


def write_figures(out: Path, print=print) -> Path | None:
    """The report with figures in ``OUT/report`` when pandas and matplotlib are installed."""
    try:
        import matplotlib  # noqa: F401
        import pandas  # noqa: F401
    except ImportError:
        print("figures skipped: pip install -e '.[analysis]', then python -m ebsp_mpi report "
              f"{out} --out {out / 'report'}")
        return None
    from ..analysis.report import write_report

    report = write_report([out], out / "report")
    for problem in report.problems:
        print(f"report: note: {problem}")
    print(f"report: {report.out / 'report.md'} ({len(report.titles)} figures)")
    return report.out


# -- Slurm ---------------------------------------------------------------------------------------

#: ``#SBATCH`` options of slurm/sweep.sbatch that rendering sets, and the shell defaults it fills in.
