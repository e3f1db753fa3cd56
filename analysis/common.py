"""What the example scripts in this folder share: their command line, finding and reading the runs,
and saving the figure.

Each script is ``python analysis/NAME.py RUN_OR_SWEEP... [--out FIG.png]``. The paths may be run
directories (``train --out``, ``simulate --out``), sweep directories (``sweep --out``, ``simulate
--sweep``) or a directory holding several; :func:`ebsp_mpi.analysis.runs.load_infos` finds the runs and
names them (a sweep member by its member name, any other run by its sync model), and
:func:`ebsp_mpi.trace.frames.load_run` reads each run's traces into one pandas DataFrame per table
(``ebsp_mpi/trace/schema.py`` names the columns). Bad input ends the script with one line on stderr
and exit code 2.
"""

from __future__ import annotations

import argparse
import sys
import textwrap
import warnings
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only, no display

from ebsp_mpi.analysis.runs import load_infos
from ebsp_mpi.errors import UsageError
from ebsp_mpi.trace.frames import load_run
from ebsp_mpi.trace.reader import TraceError

#: One colour per worker or sync model (Okabe–Ito: readable with the common colour-vision deficiencies).
PALETTE = ("#0072B2", "#E69F00", "#009E73", "#D55E00", "#CC79A7", "#56B4E9", "#000000", "#F0E442")


class NoData(UsageError):
    """The runs exist but hold nothing the figure is drawn from (e.g. no barrier in any of them)."""


def parse_args(doc: str, default_out: str, argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=doc.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("runs", nargs="+", metavar="RUN_OR_SWEEP",
                        help="run directory, sweep directory, or a directory holding several")
    parser.add_argument("--out", default=default_out, help=f"PNG file to write (default {default_out})")
    return parser.parse_args(argv)


def load(paths) -> list[tuple[str, object]]:
    """``(label, RunFrames)`` of every run the paths name that has a readable trace, ordered by sync
    model. A run that cannot be read is named on stderr and left out; none readable is an error."""
    runs, unreadable = [], []
    for info in load_infos(paths):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            try:
                frames = load_run(info.path)
            except TraceError as err:
                unreadable.append(str(err))
                continue
        runs.append((info.label, frames))
        note(*(str(w.message) for w in caught))
    if not runs:
        raise UsageError("; ".join(unreadable) or f"{', '.join(map(str, paths))}: no run")
    note(*(f"left out: {text}" for text in unreadable))
    return runs


def note(*lines: str) -> None:
    """Say something about the input on stderr, one line each, without stopping."""
    for line in lines:
        print(f"{Path(sys.argv[0]).name}: {line}", file=sys.stderr)


def named(label: str, frames) -> str:
    """A run's label, with its sync model where the label does not say it."""
    return label if label.startswith(frames.sync) else f"{label} ({frames.sync})"


def save(fig, out: str, title: str) -> None:
    """Write `fig` to `out` with `title` on top (wrapped to the figure's width), and print the path."""
    fig.suptitle(textwrap.fill(title, int(9 * fig.get_figwidth())), fontweight="bold")
    path = Path(out)
    if path.parent != Path(""):
        path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    print(path)


def main(draw, doc: str, default_out: str, argv=None) -> int:
    """Run ``draw(runs, out)`` on the runs the command line names; bad input is one line, exit code 2."""
    args = parse_args(doc, default_out, argv)
    try:
        draw(load(args.runs), args.out)
    except (UsageError, OSError) as err:
        print(f"{Path(sys.argv[0]).name}: error: {err}", file=sys.stderr)
        return 2
    return 0
