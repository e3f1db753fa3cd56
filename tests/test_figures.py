"""The figures as a user reads them: titles that quote what is drawn, nothing clipped, counts on
integer ticks, legends off the data, one colour per sync model, and no warning on the terminal.

The report's figures are drawn from runs built with known numbers (tests/test_analysis.py's
``make_run``) and from a real simulation; the studies' figures from rows of known numbers.
"""

import math
import warnings

import numpy as np
import pytest

pytest.importorskip("pandas")
pytest.importorskip("matplotlib")

from matplotlib.backends.backend_agg import FigureCanvasAgg
from test_analysis import SLOW, make_run

from ebsp_mpi.analysis import figures
from ebsp_mpi.analysis.report import write_report
from ebsp_mpi.sim.accuracy import accuracy_axes
from ebsp_mpi.sim.study import scaling_axes
from ebsp_mpi.trace.frames import load_run


@pytest.fixture
def drawn(monkeypatch):
    """The report's figures by file name, as they were saved."""
    out = {}
    save = figures._save

    def keep(fig, path, title):
        out[path.name] = fig
        return save(fig, path, title)

    monkeypatch.setattr(figures, "_save", keep)
    return out


def clipped_texts(fig) -> list[str]:
    """What of `fig` reaches past the saved image: a panel (with its title, labels and the tick labels
    it draws), a legend, the figure's title; a panel is named by its title."""
    canvas = FigureCanvasAgg(fig)
    canvas.draw()
    renderer, frame = canvas.get_renderer(), fig.bbox
    parts = [(ax.get_title(loc="left") or ax.get_title() or ax.get_ylabel(), ax) for ax in fig.axes if ax.get_visible()]
    parts += [("legend", legend) for legend in fig.legends]
    parts += [(fig._suptitle.get_text(), fig._suptitle)] if fig._suptitle is not None else []
    out = []
    for name, part in parts:
        box = part.get_tightbbox(renderer) if hasattr(part, "get_tightbbox") else part.get_window_extent(renderer)
        if box.x0 < frame.x0 - 1 or box.x1 > frame.x1 + 1 or box.y0 < frame.y0 - 1 or box.y1 > frame.y1 + 1:
            out.append(name)
    return out


def test_the_wait_figure_draws_and_quotes_the_waits_of_the_traces(tmp_path, drawn):
    """Every wait of this ASP run is 0.5 ms: the boxes stand at 0.5 ms and the title says 0.50 ms
    (a floor of 1 ms drew them as flat lines at 1 ms and quoted "1.00 ms")."""
    make_run(tmp_path / "asp", "asp")
    it = load_run(tmp_path / "asp").table("iterations")
    fast = 1000 * it.loc[it["worker"] != SLOW, "wait_s"].to_numpy()
    report = write_report([tmp_path / "asp"], tmp_path / "report")
    assert report.titles["wait.png"].endswith(f"median wait is {np.median(fast):.2f} ms under asp")
    assert np.median(fast) == pytest.approx(0.5)
    ax = drawn["wait.png"].axes[0]
    ys = np.concatenate([line.get_ydata() for line in ax.get_lines()])
    assert len(ys) and np.allclose(ys, 0.5), sorted(set(ys.round(4)))


def test_the_zipline_histogram_counts_barriers_on_integer_ticks(tmp_path, drawn):
    make_run(tmp_path / "e", "elasticbsp", rounds=10)  # two barriers: a default axis ticks 0.25 of one
    write_report([tmp_path / "e"], tmp_path / "report")
    hist = drawn["zipline.png"].axes[1]
    low, high = hist.get_ylim()
    ticks = [t for t in hist.get_yticks() if low <= t <= high]
    assert len(ticks) >= 2 and all(float(t).is_integer() for t in ticks), ticks


def test_a_report_of_simulated_runs_warns_nothing_and_clips_no_text(tmp_path, drawn):
    """A simulation has no test evaluation and no target: the accuracy figure's axis had no height
    (a matplotlib UserWarning on the terminal)."""
    from ebsp_mpi.cli import main

    for model in ("asp", "elasticbsp"):
        assert main(["simulate", "--workers", "4", "--iterations", "40", "--set", f"sync.model={model}",
                     "--set", "straggler.slowdown=[1,1,1,3]", "--out", str(tmp_path / model), "-q"]) == 0
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        report = write_report([tmp_path / "asp", tmp_path / "elasticbsp"], tmp_path / "report")
    assert set(report.titles) == set(drawn) and len(drawn) == 6
    assert {name: clipped_texts(fig) for name, fig in drawn.items()} == {name: [] for name in drawn}


def test_no_text_of_the_live_report_is_clipped_and_no_table_repeats(tmp_path, drawn):
    for model, speed in (("bsp", 20.0), ("asp", 40.0), ("elasticbsp", 30.0)):
        make_run(tmp_path / model, model, speed=speed)
    write_report([tmp_path / m for m in ("bsp", "asp", "elasticbsp")], tmp_path / "report")
    assert len(drawn) == 6
    assert {name: clipped_texts(fig) for name, fig in drawn.items()} == {name: [] for name in drawn}
    page = (tmp_path / "report" / "report.md").read_text().splitlines()
    headers = [line for i, line in enumerate(page[:-1]) if line.startswith("| ") and page[i + 1].startswith("|---")]
    assert len(headers) == 3 and len(set(headers)) == 3, headers  # summary, comparison, ZipLine: once each


# -- the studies' figures -------------------------------------------------------------------------

#: the accuracy study's lines (jobs/simulations/accuracy.toml): (sync model, line name)
STUDY_LINES = (("bsp", "bsp"), ("asp", "asp"), ("asp", "asp+scale"), ("asp", "asp+dc"), ("ssp", "ssp(s=3)"),
               ("ssp", "ssp(s=3)+scale"), ("dssp", "dssp(s=3,r=3)"), ("elasticbsp", "elasticbsp(R=15)"),
               ("elasticbsp", "elasticbsp(R=15)+scale"), ("psp", "psp(β=2,s=3)"),
               ("elasticbsp", "elasticbsp(R=15,z=auto,ema)+scale"))


def _accuracy_rows():
    t = np.linspace(0.1, 4.0, 40)
    return [{"sync": sync, "line": line, "workers": n, "batch": 32,
             "evals": list(zip(t, 1 - 0.9 * np.exp(-(k + 1) * t / 4), strict=True))}
            for n in (4, 16, 64, 256, 1024) for k, (sync, line) in enumerate(STUDY_LINES)]


def test_the_accuracy_study_gives_each_sync_model_its_own_colour_and_each_line_its_own_look():
    fig = accuracy_axes(_accuracy_rows())
    lines = {line.get_label(): line for ax in fig.axes for line in ax.get_lines()}
    model = {name: sync for sync, name in STUDY_LINES}
    colours = {}
    for name, line in lines.items():
        colours.setdefault(line.get_color(), set()).add(model[name])
    assert all(len(models) == 1 for models in colours.values()), colours  # a colour names one model
    assert len(colours) == len(set(model.values()))
    looks = {(line.get_color(), str(line.get_linestyle())) for line in lines.values()}
    assert len(looks) == len(STUDY_LINES)


def _overlaps(a, b) -> bool:
    return a.x0 < b.x1 and b.x0 < a.x1 and a.y0 < b.y1 and b.y0 < a.y1


def test_the_accuracy_study_legend_covers_no_panel_and_no_text_is_clipped():
    fig = accuracy_axes(_accuracy_rows())
    assert clipped_texts(fig) == []
    renderer = fig.canvas.get_renderer()
    legends = fig.legends + [ax.get_legend() for ax in fig.axes if ax.get_legend()]
    assert len(legends) == 1
    box = legends[0].get_window_extent(renderer)
    assert not any(_overlaps(box, ax.get_window_extent(renderer)) for ax in fig.axes)


def _scaling_rows():
    rows = []
    for k, model in enumerate(("asp", "bsp", "ssp(s=3)", "dssp(s=3,r=3)", "elasticbsp(R=15)", "elasticbsp(R=3)",
                               "psp(β=8,s=3)")):
        for n in (4, 16, 64, 256, 1024, 4096):
            elastic = model.startswith("elasticbsp")
            rows.append({"model": model, "workers": n, "vs_asp": 1 + 0.2 * k * math.log2(n),
                         "wait_share": 0.05 * k, "staleness_rounds": 0.1 * k,
                         "predicted_spread_ms": 5.0 * n ** 0.3 if elastic else math.nan,
                         "interval_spread_ms": math.nan,
                         "observed_spread_ms": 20.0 * n ** 0.3 if elastic else math.nan})
    return rows


def test_the_scaling_figure_clips_no_panel_title_and_its_legend_covers_no_panel():
    fig = scaling_axes(_scaling_rows())
    assert clipped_texts(fig) == []
    renderer = fig.canvas.get_renderer()
    assert len(fig.legends) == 1
    box = fig.legends[0].get_window_extent(renderer)
    assert not any(_overlaps(box, ax.get_window_extent(renderer)) for ax in fig.axes)
