"""``compare`` and ``report`` as a user meets them: throughput beside the times, a warning where a time
to target means nothing, and a report without ``--out``.

Runs are built with known numbers by tests/test_analysis.py's ``make_run``: evaluations every 0.1 s
from t = 0.1 s, summary ``samples_per_second`` 1000.
"""

import csv
import json
import math

import pytest
from test_analysis import make_run

from ebsp_mpi.analysis import compare
from ebsp_mpi.analysis.runs import load_infos
from ebsp_mpi.cli import main


def make_run_with_evals(path, sync, speed):
    """make_run's run, its summary with the ``evals`` a real run's has (make_run's evaluations)."""
    make_run(path, sync, speed=speed)
    doc = json.loads((path / "summary.json").read_text())
    doc["evals"] = [{"t": 0.1 * k, "version": k, "test_loss": 0.5, "test_acc": 1.0 - 0.9 * math.exp(-speed * 0.1 * k)}
                    for k in range(1, 8)]
    (path / "summary.json").write_text(json.dumps(doc))


def test_compare_shows_each_runs_samples_per_second(tmp_path, capsys):
    make_run(tmp_path / "bsp", "bsp", speed=2.0)
    make_run(tmp_path / "asp", "asp", speed=4.0)
    assert main(["compare", str(tmp_path), "--out", str(tmp_path / "cmp")]) == 0
    table = [line for line in capsys.readouterr().out.splitlines() if line.startswith("| ")]
    header = [c.strip() for c in table[0].strip("|").split("|")]
    rows = [[c.strip() for c in line.strip("|").split("|")] for line in table[1:]]
    column = header.index("samples/s")
    assert [row[column] for row in rows] == ["1,000", "1,000"]
    with (tmp_path / "cmp" / "compare.csv").open() as f:
        assert [float(r["samples_per_second"]) for r in csv.DictReader(f)] == [1000.0, 1000.0]


def test_a_target_reached_at_the_first_evaluation_is_one_warning_line(tmp_path, capsys):
    """The fast run is at 0.98 at its first evaluation (0.1 s): its times to 0.9 and 0.95 only say
    "by 0.1 s". One note names it, and its times are marked; the slow run's are not."""
    make_run_with_evals(tmp_path / "slow", "bsp", speed=2.0)
    make_run_with_evals(tmp_path / "fast", "asp", speed=40.0)
    assert main(["compare", str(tmp_path / "slow"), str(tmp_path / "fast")]) == 0
    printed = capsys.readouterr()
    notes = [line for line in printed.err.splitlines() if "first evaluation" in line]
    assert notes == [("compare: note: 1 run(s) reached a target at their first evaluation: fast (0.9, 0.95 at "
                      "0.10 s); such a time (≤ in the table) and its ratio only bound the real one: evaluate "
                      "more often (eval.every_seconds)")], printed.err
    rows = {line.split("|")[1].strip(): line for line in printed.out.splitlines() if line.startswith("| ")}
    assert rows["fast"].count("≤0.10") == 2 and "≤" not in rows["slow"]


def test_no_warning_where_every_target_came_after_the_first_evaluation(tmp_path, capsys):
    make_run_with_evals(tmp_path / "slow", "bsp", speed=2.0)
    cmp = compare.compare(load_infos([tmp_path / "slow"]))
    assert compare.first_eval_note(cmp) is None
    assert main(["compare", str(tmp_path / "slow")]) == 0
    assert "first evaluation" not in capsys.readouterr().err


@pytest.mark.parametrize("several", [False, True])
def test_report_without_out_writes_beside_one_run_or_into_report_here(tmp_path, monkeypatch, capsys, several):
    pytest.importorskip("pandas")
    pytest.importorskip("matplotlib")
    make_run(tmp_path / "runs" / "a", "bsp")
    make_run(tmp_path / "runs" / "b", "asp")
    monkeypatch.chdir(tmp_path)
    args = ["runs/a", "runs/b"] if several else ["runs/a"]
    assert main(["report", *args]) == 0
    where = tmp_path / ("report" if several else "runs/a/report")
    assert (where / "report.md").is_file()
    last = capsys.readouterr().out.splitlines()[-1]
    assert last == f"{where.relative_to(tmp_path) / 'report.md'}: the report on one page"
