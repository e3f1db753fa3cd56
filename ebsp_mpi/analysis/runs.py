"""Which directories are runs, and what each run is called (its label, sync model and seed).

A *run directory* is what ``train --out DIR`` writes: ``summary.json`` and ``trace/``. A *sweep
directory* is what ``sweep`` writes: a ``sweep.json`` manifest and one run directory per member. Every
command of the analysis accepts either, or a parent directory holding several of them.

Labels: a sweep member is labelled by its member name without the seed suffix (``ssp-s3`` for
``ssp-s3-seed1``), so that the seeds of one member group together; any other run by its sync model and
the parameters that define it (``ssp(s=3)``, ``elasticbsp(R=15)``).
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from ..errors import UsageError
from ..sync.registry import POLICIES

#: name of the manifest a sweep writes in its output directory
MANIFEST = "sweep.json"


@dataclass
class RunInfo:
    """A run as the comparison sees it: its summary, label, sync model and seed.

    Attributes
    ----------
    path : pathlib.Path
    summary : dict
        ``summary.json``; ``{}`` when the run did not finish (see ``problem``): a summary whose
        ``wall_seconds`` is null is a crashed run's, never a reference or a row of medians.
    config : dict
        The resolved job (from the summary, else from the server's trace attributes).
    label : str
        Group name: runs with one label are repetitions over seeds.
    model : str
        Sync model (``bsp``, ``asp``, ``ssp``, ``dssp``, ``elasticbsp``, ``psp``).
    seed : int or None
    problem : str or None
        Why the run counts as not finished (no directory, summary missing, unreadable or with a
        null ``wall_seconds``), naming the path; ``None`` for a finished run.
    simulated : bool
        A run of ``simulate`` (its summary's backend ``"simulated"``): its seconds are virtual, its
        label ends in `` (simulated)``, and the comparison never divides it by a live run's seconds.
    """

    path: Path
    summary: dict = field(default_factory=dict)
    config: dict = field(default_factory=dict)
    label: str = "?"
    model: str = "?"
    seed: int | None = None
    problem: str | None = None
    simulated: bool = False

    @property
    def finished(self) -> bool:
        return self.problem is None and bool(self.summary)


def is_run_dir(path: Path) -> bool:
    return path.is_dir() and ((path / "summary.json").is_file() or (path / "trace").is_dir())


def is_sweep_dir(path: Path) -> bool:
    return (path / MANIFEST).is_file()


def find_runs(paths: Iterable[str | os.PathLike]) -> list[Path]:
    """The run directories named by ``paths`` (run, sweep or parent directories), in the order given.

    A sweep directory gives its members in the manifest's order, including members whose directory
    is missing (a failed or not yet run member), so that the comparison can name them.

    Raises
    ------
    UsageError
        When a path does not exist or holds no run.
    """
    found: list[Path] = []
    for raw in paths:
        path = Path(raw)
        if not path.exists():
            raise UsageError(f"{path}: no such directory (expected a run or sweep directory)")
        if is_sweep_dir(path):
            members = sweep_members(path)
            if not members:
                raise UsageError(f"{path / MANIFEST}: names no members (an empty sweep file?)")
            found += members
        elif is_run_dir(path):
            found.append(path)
        elif path.is_dir():
            inner = sorted(p for p in path.iterdir() if is_run_dir(p) or is_sweep_dir(p))
            if not inner:
                raise UsageError(f"{path}: neither a run directory (summary.json, trace/) nor a sweep "
                                 f"directory ({MANIFEST}), and none inside it")
            found += find_runs(inner)
        else:
            raise UsageError(f"{path}: not a directory (expected a run or sweep directory)")
    unique: list[Path] = []
    for path in found:  # a run named twice (a sweep and one of its members) counts once
        if path.resolve() not in {p.resolve() for p in unique}:
            unique.append(path)
    return unique


def read_manifest(sweep_dir: Path) -> dict:
    """The sweep's manifest: an object whose ``members`` is a list of objects, each with its ``dir``.

    Raises
    ------
    UsageError
        When the file is not JSON or not of that shape, naming it and what was expected.
    """
    path = sweep_dir / MANIFEST
    try:
        doc = json.loads(path.read_text())
    except (OSError, ValueError) as err:
        raise UsageError(f"{path}: unreadable sweep manifest ({err})") from None
    members = doc.get("members", []) if isinstance(doc, dict) else None
    if not isinstance(members, list) or not all(_is_member(m) for m in members):
        raise UsageError(f"{path}: not a sweep manifest: expected an object whose \"members\" is a list of "
                         f"objects, each with a \"dir\" (the member's directory name)")
    return doc


def _is_member(entry) -> bool:
    return isinstance(entry, dict) and isinstance(entry.get("dir"), str) and bool(entry["dir"])


def sweep_members(sweep_dir: Path) -> list[Path]:
    return [sweep_dir / m["dir"] for m in read_manifest(sweep_dir).get("members", [])]


def section(config: dict, name: str) -> dict:
    """``config[name]`` where it is a table of the job (a dict), else ``{}``: a hand-edited or foreign
    config must not make the analysis fail on a ``.get`` of a string."""
    value = config.get(name)
    return value if isinstance(value, dict) else {}


def _seed(value) -> int | None:
    # a seed orders the runs: anything but an integer would not compare with the others
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def model_label(config: dict) -> str:
    """The sync model with the parameters that define it, e.g. ``ssp(s=3)`` or ``dssp(s=3,r=3)``, and a
    staleness-aware update rule where there is one (``asp+scale``, ``asp+dc``)."""
    rule = section(config, "optim").get("staleness") or "none"
    label = _sync_label(section(config, "sync"))
    return label if rule == "none" else f"{label}+{rule}"


def _sync_label(sync: dict) -> str:
    model = sync.get("model", "?")
    if model == "ssp":
        return f"ssp(s={sync.get('staleness')})"
    if model == "dssp":
        return f"dssp(s={sync.get('staleness')},r={sync.get('dssp_range')})"
    if model == "psp":
        return f"psp(β={sync.get('sample')},s={sync.get('staleness')})"
    if model == "elasticbsp":
        penalty = sync.get("penalty") or 0
        shown = f"{penalty:g}" if isinstance(penalty, (int, float)) else str(penalty)
        # z, the predictor, the overdue and re-plan rules only where they differ from the paper's (older runs
        # have none of them)
        z = sync.get("zipline_z") or 0
        extra = f",λ={shown}" if penalty else ""
        extra += f",z={z:g}" if isinstance(z, (int, float)) and z else (f",z={z}" if z else "")
        extra += f",{sync['predictor']}" if sync.get("predictor", "last") != "last" else ""
        extra += f",overdue={sync['overdue']}" if sync.get("overdue", "none") != "none" else ""
        extra += f",replan={sync['replan']}" if sync.get("replan", "none") != "none" else ""
        return f"elasticbsp(R={sync.get('lookahead')}{extra})"
    return model


def _member_group(run_dir: Path) -> tuple[str | None, int | None]:
    """(group, seed) of a sweep member from the manifest of the directory above it."""
    parent = run_dir.parent
    if not is_sweep_dir(parent):
        return None, None
    try:
        members = read_manifest(parent).get("members", [])
    except UsageError:
        return None, None
    for m in members:
        if m.get("dir") == run_dir.name:
            group = m.get("group")
            return (group if isinstance(group, str) else None), _seed(m.get("seed"))
    return None, None


def _config_from_trace(run_dir: Path) -> dict:
    from ..trace.reader import TraceError, read_trace

    try:
        return read_trace(run_dir / "trace" / "rank-0000.h5").config
    except TraceError:
        return {}


def _read_summary(run_dir: Path) -> tuple[dict, str | None]:
    from ..trace.reader import read_summary

    if not run_dir.is_dir():
        return {}, f"{run_dir}: missing (the member failed before it started?)"
    return read_summary(run_dir)


#: the backend a simulated run's summary names (``ebsp_mpi.sim.run``)
SIMULATED = "simulated"


def read_info(run_dir: str | os.PathLike) -> RunInfo:
    """Read a run's summary and name it; a run that did not finish gets a ``problem`` and no summary
    (its label and seed still come from the manifest or the job it ran)."""
    run_dir = Path(run_dir)
    doc, problem = _read_summary(run_dir)
    summary = doc if problem is None else {}
    config = doc.get("config") or (_config_from_trace(run_dir) if run_dir.is_dir() else {})
    group, seed = _member_group(run_dir)
    model = doc.get("sync") or section(config, "sync").get("model", "?")
    if not isinstance(model, str):
        model = "?"
    if seed is None:
        seed = _seed(config.get("seed"))
    label = group or (model_label(config) if config else run_dir.name)
    simulated = doc.get("backend") == SIMULATED
    if simulated:  # virtual seconds: never averaged with, nor divided by, a live run's wall seconds
        label += " (simulated)"
    return RunInfo(path=run_dir, summary=summary, config=config, label=label, model=model, seed=seed,
                   problem=problem, simulated=simulated)


def model_rank(model: str) -> int:
    """Position of a sync model in docs/design.md's order (bsp, asp, ssp, dssp, elasticbsp, psp); others last."""
    return POLICIES.index(model) if model in POLICIES else len(POLICIES)


def ordered(runs: Iterable[RunInfo]) -> list[RunInfo]:
    """Runs sorted by sync model (docs/design.md's order), then label, then seed; stable otherwise."""
    return sorted(runs, key=lambda r: (model_rank(r.model), r.label, -1 if r.seed is None else r.seed))


def distinct_labels(runs: Iterable[RunInfo]) -> list[RunInfo]:
    """Make labels unique where two runs share (label, seed) but are different runs: append the
    directory name, so no two runs are silently averaged as if they were seeds of one member."""
    runs = list(runs)
    seen: dict[tuple, int] = {}
    for r in runs:
        seen[(r.label, r.seed)] = seen.get((r.label, r.seed), 0) + 1
    for r in runs:
        if seen[(r.label, r.seed)] > 1:
            r.label = f"{r.label} [{r.path.name}]"
    return runs


def load_infos(paths: Iterable[str | os.PathLike]) -> list[RunInfo]:
    """:func:`read_info` of every run :func:`find_runs` names, ordered, with distinct labels."""
    return ordered(distinct_labels(read_info(p) for p in find_runs(paths)))
