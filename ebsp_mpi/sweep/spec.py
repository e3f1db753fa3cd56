"""Sweep files: parsing and checking a base job plus override sets, expanded over seeds."""

from __future__ import annotations

import json
import math
import os
import re
from dataclasses import dataclass
from pathlib import Path

from ..config import check_workers, load_job, read_toml
from ..errors import UsageError

#: Keys of a sweep file, and of one of its [[member]] tables.
SWEEP_KEYS = ("name", "description", "base", "set", "seeds", "ranks", "timeout_s", "member")
MEMBER_KEYS = ("name", "set")
DEFAULT_TIMEOUT_S = 600.0
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.+-]*$")


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
    base = _base(doc, path, where)
    common = _overrides(doc.get("set", []), f"{where}: set")
    if seeds is None:
        seeds = doc.get("seeds")
    else:
        where = f"{where} with --seeds"  # every later error may come of the seeds given
    _check_seeds(seeds, where)
    ranks, timeout, description = _settings(doc, where)
    members = _members(doc, common, seeds, where)
    return Sweep(path=path, name=name, base=base, members=members, ranks=ranks, timeout_s=float(timeout),
                 description=description)


def _base(doc: dict, path: Path, where: str) -> Path | None:
    """The sweep's base job file, relative to the sweep file; None without one."""
    if "base" not in doc:
        return None
    if not isinstance(doc["base"], str) or not doc["base"]:
        raise SweepError(f"{where}: base = {doc['base']!r}: must be the path of a job file")
    # relative to the sweep file; normpath keeps a relative path relative (jobs/stragglers/base.toml)
    base = Path(os.path.normpath(path.parent / doc["base"]))
    if not base.is_file():
        raise SweepError(f"{where}: base = {doc['base']!r}: job file {base} not found "
                         f"(a relative base is read from the sweep file's directory)")
    return base


def _check_seeds(seeds, where: str) -> None:
    if seeds is None:
        return
    if (not isinstance(seeds, list) or not seeds
            or not all(isinstance(s, int) and not isinstance(s, bool) and s >= 0 for s in seeds)):
        raise SweepError(f"{where}: seeds = {seeds!r}: must be a non-empty list of integers >= 0")
    if len(set(seeds)) != len(seeds):
        raise SweepError(f"{where}: seeds = {seeds!r}: a seed is repeated")


def _settings(doc: dict, where: str) -> tuple[int | None, float, str]:
    """``ranks``, ``timeout_s`` and ``description``, checked."""
    ranks = doc.get("ranks")
    if ranks is not None and (not isinstance(ranks, int) or isinstance(ranks, bool) or ranks < 2):
        raise SweepError(f"{where}: ranks = {ranks!r}: must be an integer >= 2 (the server and a worker)")
    timeout = doc.get("timeout_s", DEFAULT_TIMEOUT_S)
    # inf would be no timeout at all, and a member that hangs would hold the sweep forever
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not 0 < timeout < math.inf:
        raise SweepError(f"{where}: timeout_s = {timeout!r}: must be a finite number of seconds > 0")
    description = doc.get("description", "")
    if not isinstance(description, str):
        raise SweepError(f"{where}: description = {description!r}: must be a string")
    return ranks, timeout, description


def _members(doc: dict, common: list[str], seeds: list[int] | None, where: str) -> list[Member]:
    """The ``[[member]]`` tables, each expanded over the seeds (one member without seeds)."""
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
    return members


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
