"""Divergence made visible: DivergenceWatch on scripted evaluations, then runs that diverge (one
warning, summary.json's ``divergence``, marked by compare and report) and runs that learn (none)."""

import json
import logging
import math
import sys
from pathlib import Path

import numpy as np
import pytest

from ebsp_mpi.cli import main
from ebsp_mpi.divergence import DivergenceWatch, chance_accuracy

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

WATCH = "ebsp_mpi.divergence"
STUDY = Path(__file__).parents[1] / "jobs" / "simulations" / "accuracy.toml"


def watch(evals=5, factor=10.0):
    return DivergenceWatch(chance=0.1, evals=evals, loss_factor=factor, lr=0.05, momentum=0.9)


def test_chance_is_the_most_common_class_share():
    assert chance_accuracy(np.array([0, 1, 1, 2])) == 0.5


def test_five_new_versions_at_chance_make_one_warning_naming_staleness_and_knobs(caplog):
    w = watch()
    for _ in range(30):
        w.push(15)
    with caplog.at_level(logging.WARNING, logger=WATCH):
        for k in range(1, 9):
            w.observe(0.1 * k, 10 * k, 2.3, 0.1)
    assert [r.name for r in caplog.records] == [WATCH]  # once, not at every evaluation after
    f = w.finding
    assert f["seen"] == "chance" and f["version"] == 50 and f["mean_staleness"] == 15
    message = caplog.records[0].getMessage()
    assert message == f["message"]
    for words in ("stayed at chance", "5 evaluations", "versions 10-50", "15.0 versions stale", "momentum 0.9",
                  "optim.staleness=scale", "lower optim.lr (now 0.05)"):
        assert words in message


def test_repeated_weights_version_zero_and_a_learning_evaluation_do_not_count():
    w = watch()
    w.observe(0.1, 0, 2.3, 0.1)            # the initial weights
    for k in range(10):
        w.observe(0.2 + k, 1, 2.3, 0.1)    # one version evaluated again and again
    for k in range(2, 5):
        w.observe(k, k, 2.3, 0.1)          # 3 new versions at chance (with version 1: 4) ...
    w.observe(6, 6, 1.0, 0.5)              # ... then one that learned: the count starts again
    for k in range(7, 11):
        w.observe(k, k, 2.3, 0.1)
    assert w.finding is None
    w.observe(11, 11, 2.3, 0.1)
    assert w.finding["seen"] == "chance"


def test_loss_grown_tenfold_above_its_best_or_not_finite():
    w = watch()
    for t, loss in enumerate([2.0, 0.5, 0.3, 1.2, 2.9]):  # overfitting's growth (x 9.7) is not divergence
        w.observe(t, t + 1, loss, 0.9)
    assert w.finding is None
    w.observe(5, 6, 3.1, 0.5)
    assert w.finding["seen"] == "loss" and "more than 10 x its best 0.3" in w.finding["message"]
    nan = watch()
    nan.observe(0, 1, math.nan, 0.1)
    assert nan.finding["seen"] == "loss" and nan.finding["test_loss"] is None


def test_fresh_gradients_blame_the_learning_rate_and_zero_turns_a_rule_off():
    w = watch()
    for _ in range(4):
        w.push(0)
    for k in range(1, 6):
        w.observe(k, k, 2.3, 0.1)
    assert "learning rate 0.05 with momentum 0.9 is too large" in w.finding["message"]
    assert "optim.staleness" not in w.finding["message"]
    off = watch(evals=0, factor=0.0)
    for k in range(1, 20):
        off.observe(k, k, 10.0 ** k, 0.1)
    assert off.finding is None


# -- runs -------------------------------------------------------------------------------------------


def study_job(member: str) -> list[str]:
    """The --set list of one member of the accuracy study (jobs/simulations/accuracy.toml)."""
    with open(STUDY, "rb") as f:
        sweep = tomllib.load(f)
    (sets,) = [m["set"] for m in sweep["member"] if m["name"] == member]
    return [a for s in sweep["set"] + sets for a in ("--set", s)]


def simulate(tmp_path, caplog, name: str, extra: list[str]) -> tuple[dict, list[str]]:
    out = tmp_path / name
    with caplog.at_level(logging.WARNING, logger=WATCH):
        caplog.clear()
        assert main(["simulate", "--train", "-q", *extra, "--out", str(out)]) == 0
        warned = [r.getMessage() for r in caplog.records if r.name == WATCH]
    return json.loads((out / "summary.json").read_text()), warned


@pytest.mark.parametrize("member", ["bsp-n16", "asp-scale-n16", "elasticbsp-R15-scale-n16", "asp-n16"])
def test_the_accuracy_studys_rows_warn_exactly_when_they_end_at_chance(tmp_path, caplog, member):
    extra = study_job(member) + ["--set", "stop.seconds=2"]
    summary, warned = simulate(tmp_path, caplog, member, extra)
    learned = summary["test_accuracy"] > 0.5
    assert learned == (member != "asp-n16")  # the study's finding, on a shorter run
    if learned:
        assert summary["divergence"] is None and warned == []
    else:
        assert len(warned) == 1 and summary["divergence"]["message"] == warned[0]
        assert summary["divergence"]["seen"] in ("chance", "loss") and summary["divergence"]["mean_staleness"] > 5


def test_the_issues_run_diverges_and_scale_fixes_it(tmp_path, caplog):
    """simulate --train --workers 16 --set sync.model=asp, evaluated often enough to see it."""
    base = ["--workers", "16", "--set", "sync.model=asp", "--set", "eval.every_seconds=0.05"]
    diverged, warned = simulate(tmp_path, caplog, "asp", base)
    assert diverged["test_accuracy"] < 0.15 and len(warned) == 1
    assert "optim.staleness=scale" in warned[0] and "momentum 0.9" in warned[0]
    scaled, warned = simulate(tmp_path, caplog, "asp-scale", [*base, "--set", "optim.staleness=scale"])
    assert scaled["test_accuracy"] > 0.5 and scaled["divergence"] is None and warned == []


def test_single_process_live_run_warns_on_too_large_a_learning_rate(tmp_path, caplog):
    runs = {}
    for name, lr in (("fine", "0.05"), ("too-large", "3")):
        with caplog.at_level(logging.WARNING, logger=WATCH):
            caplog.clear()
            assert main(["train", "-q", "--set", f"optim.lr={lr}", "--set", "eval.every_seconds=0.01",
                         "--set", "stop.epochs=20", "--out", str(tmp_path / name)]) == 0
            runs[name] = [r.getMessage() for r in caplog.records if r.name == WATCH]
    assert runs["fine"] == []
    assert len(runs["too-large"]) == 1 and "learning rate 3 with momentum 0.9" in runs["too-large"][0]
    summary = json.loads((tmp_path / "too-large" / "summary.json").read_text())
    assert summary["divergence"]["seen"] in ("chance", "loss")


def test_compare_and_report_mark_the_run_that_diverged(tmp_path, caplog, capsys):
    base = ["--workers", "16", "--set", "eval.every_seconds=0.05", "--set", "sync.model=asp"]
    simulate(tmp_path, caplog, "asp", base)
    simulate(tmp_path, caplog, "asp-scale", [*base, "--set", "optim.staleness=scale"])
    capsys.readouterr()
    main(["compare", str(tmp_path / "asp"), str(tmp_path / "asp-scale")])
    text = capsys.readouterr().out
    marked = text.split("### Diverged", 1)[1]
    assert "**asp**" in marked and "**asp-scale**" not in marked and "optim.staleness=scale" in marked
    pytest.importorskip("pandas")
    pytest.importorskip("matplotlib")
    from ebsp_mpi.analysis.report import write_report

    write_report([tmp_path / "asp", tmp_path / "asp-scale"], tmp_path / "report")
    page = (tmp_path / "report" / "report.md").read_text()
    assert "### Diverged" in page and "**asp**" in page.split("### Diverged", 1)[1]
