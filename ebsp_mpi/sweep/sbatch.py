"""Rendering ``slurm/sweep.sbatch`` for a sweep: a job array, one task per member."""

from __future__ import annotations

import math
import os
import re
import shlex
from pathlib import Path

from .spec import Sweep, SweepError

_SBATCH_LINE = r"^#SBATCH --{key}=.*$"
_SHELL_DEFAULT = r"^{key}=\$\{{{key}:-.*\}}$"


def default_template() -> Path:
    """``slurm/sweep.sbatch`` of the source checkout this package runs from."""
    return Path(__file__).resolve().parents[2] / "slurm" / "sweep.sbatch"


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
