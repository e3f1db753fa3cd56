"""What the documentation's commands write into a clone stays out of ``git status``.

Every ``python -m ebsp_mpi`` line of README.md, docs/*.md and slurm/README.md that names an output
inside the working tree (``--out``, ``-o``, ``--json``, ``--sbatch``), and the files the commands write
without one (``plan``: plan.json, ``profile``: osdp-profile.json, ``report``: report/), must be ignored.
"""

import re
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", ROOT / "slurm" / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
OPTION = re.compile(r"(?:--out|-o|--json|--sbatch)[ =]([^\s`|;)]+)")
#: what a command writes when its line names no output
DEFAULTS = {"plan": "plan.json", "profile": "osdp-profile.json", "report": "report/"}


def documented_outputs() -> set[str]:
    outputs = set()
    for doc in DOCS:
        for line in doc.read_text().splitlines():
            command = re.search(r"python -m ebsp_mpi (\w+)", line)
            if not command:
                continue
            named = OPTION.findall(line)
            outputs |= {p for p in named if not p.startswith(("/", "$", "~")) and not p.isupper() and p != "-"}
            if not named and command.group(1) in DEFAULTS:
                outputs.add(DEFAULTS[command.group(1)])
    return outputs


def test_the_docs_name_outputs_in_the_tree():
    outputs = documented_outputs()
    assert {"report/", "trace.json", "plan.json", "mpi.json"} <= outputs, outputs


def test_every_output_the_docs_write_into_the_tree_is_ignored():
    if shutil.which("git") is None or not (ROOT / ".git").exists():
        pytest.skip("not a git checkout")
    outputs = sorted(documented_outputs())
    # check-ignore prints the paths it ignores (it needs no file to exist)
    p = subprocess.run(["git", "check-ignore", "--no-index", *outputs], cwd=ROOT, capture_output=True, text=True,
                       timeout=30)
    assert p.returncode in (0, 1), p.stderr
    assert sorted(set(outputs) - set(p.stdout.split())) == []
