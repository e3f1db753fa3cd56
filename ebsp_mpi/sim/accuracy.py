"""The accuracy side of a sweep simulated with real weights (``simulate --sweep FILE --train``).

One row per member: model, workers, each worker's batch, pushes, the final test accuracy, the virtual
time at which the evaluated accuracy first reached each of the job's targets (``eval.targets``) and
that time against BSP's at the same number of workers (and seed, in a sweep over seeds); and a
figure, accuracy against virtual time, one panel per number of workers. It reads the members'
``summary.json`` only.
"""

from __future__ import annotations

import csv
import json
import math
from pathlib import Path

from ..analysis.runs import model_label


def accuracy_rows(out_dir: Path) -> list[dict]:
    """One row per member of the sweep in `out_dir` (the manifest's order)."""
    manifest = json.loads((out_dir / "sweep.json").read_text())
    summaries = [(m["name"], json.loads((out_dir / m["dir"] / "summary.json").read_text()))
                 for m in manifest["members"]]
    rows = []
    for name, s in summaries:
        reached = {float(k): v for k, v in (s.get("time_to_accuracy") or {}).items()}
        rows.append({"member": name, "seed": (s.get("config") or {}).get("seed"),
                     "model": model_label(s.get("config") or {}), "sync": s["sync"],
                     "workers": s["workers"], "batch": (s.get("config") or {}).get("data", {}).get("batch_size"),
                     "pushes": sum(s["iterations"]), "test_accuracy": s["test_accuracy"],
                     **{f"t_{t:g}": (math.nan if v is None else v) for t, v in sorted(reached.items())},
                     "evals": [(e["t"], e["test_acc"]) if isinstance(e, dict) else (e[0], e[3])
                               for e in s.get("evals") or []]})
    # a line's name: its model, or where two members share a model, a worker count and a seed, the
    # member (one member's seeds are one line's look: the seeds' spread is what the figure shows)
    def same(r):
        return r["model"], r["workers"], r["seed"]

    twins = {same(r) for r in rows if sum(same(o) == same(r) for o in rows) > 1}
    for r in rows:
        r["line"] = r["member"] if same(r) in twins else r["model"]
    for r in rows:  # each target's time against BSP's at the same n on the same seed
        bsp = next((b for b in rows if b["sync"] == "bsp" and b["workers"] == r["workers"]
                    and b["seed"] == r["seed"]), None)
        for key in [k for k in r if k.startswith("t_")]:
            r[f"{key}_vs_bsp"] = r[key] / bsp[key] if bsp and bsp.get(key) and not math.isnan(bsp[key]) \
                else math.nan
    return rows


def write_accuracy(out_dir: Path) -> None:
    """``accuracy.csv``, ``accuracy.md`` and ``accuracy.png`` in `out_dir`."""
    rows = accuracy_rows(out_dir)
    columns = [c for c in rows[0] if c not in ("evals", "line")] if rows else []
    with (out_dir / "accuracy.csv").open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=columns, extrasaction="ignore")
        writer.writeheader()
        writer.writerows(rows)
    # the member names the row (two of one model differ there, and its name ends in its seed)
    shown = [c for c in columns if c not in ("sync", "seed")]
    lines = ["| " + " | ".join(shown) + " |", "|" + "|".join("---" for _ in shown) + "|"]
    lines += ["| " + " | ".join(_cell(r.get(c)) for c in shown) + " |" for r in rows]
    (out_dir / "accuracy.md").write_text("\n".join(lines) + "\n")
    accuracy_figure(rows, out_dir / "accuracy.png")


def _cell(value) -> str:
    if isinstance(value, float):
        return "—" if math.isnan(value) else f"{value:.3f}"
    return "—" if value is None else str(value)


#: Okabe–Ito colours per sync model, the pairs that are alike (orange and vermillion, sky blue and
#: blue) never both given to models with several variants, whose lines share the dash patterns
MODEL_COLOURS = {"bsp": "#000000", "asp": "#E69F00", "ssp": "#009E73", "dssp": "#56B4E9",
                 "elasticbsp": "#0072B2", "psp": "#CC79A7"}
#: line styles of a sync model's variants (its staleness rule, its ZipLine), in the order they come
VARIANT_STYLES = ("-", "--", ":", "-.", (0, (5, 1, 1, 1, 1, 1)))


def line_styles(rows: list[dict]) -> dict[str, tuple[str, object]]:
    """(colour, line style) per line: the colour names the sync model, the style the variant of it
    (``+scale``, ``+dc``, robust ZipLine), so that eleven lines need six colours, not eleven shades."""
    from ..analysis.figures import PALETTE

    models = list(dict.fromkeys(r["sync"] for r in rows))
    spare = [c for c in PALETTE if c not in MODEL_COLOURS.values()]
    colour = {m: MODEL_COLOURS.get(m) or spare[i % len(spare)] for i, m in enumerate(models)}
    out: dict[str, tuple[str, object]] = {}
    for r in rows:
        if r["line"] not in out:
            variant = sum(1 for c, _ in out.values() if c == colour[r["sync"]])
            out[r["line"]] = (colour[r["sync"]], VARIANT_STYLES[variant % len(VARIANT_STYLES)])
    return out


def accuracy_figure(rows: list[dict], path: Path) -> None:
    """Test accuracy against virtual time, one panel per number of workers, one line per model (per
    member where two share a model)."""
    accuracy_axes(rows).savefig(path, dpi=80)


def accuracy_axes(rows: list[dict]):
    """The figure of :func:`accuracy_figure`, not yet saved (a test measures where its texts fall)."""
    from matplotlib.figure import Figure

    sizes = sorted({r["workers"] for r in rows})
    style = line_styles(rows)
    width = max(4 * len(sizes), 10)
    fig = Figure(figsize=(width, 4.8), layout="constrained")
    axes = fig.subplots(1, len(sizes), sharey=True, squeeze=False)[0]
    for ax, n in zip(axes, sizes, strict=True):
        for r in (r for r in rows if r["workers"] == n):
            colour, dashes = style[r["line"]]
            ax.plot([t for t, _ in r["evals"]], [a for _, a in r["evals"]], color=colour, ls=dashes,
                    label=r["line"], lw=1.5)
        ax.set_title(f"{n} workers (batch {next(r['batch'] for r in rows if r['workers'] == n)})", fontsize=10.5,
                     loc="left")
        ax.set_xlabel("virtual seconds")
        ax.set_ylim(0, 1)
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("test accuracy")
    # one legend for every panel, under them: inside a panel it covered the lines (colour: sync model,
    # style: its variant)
    handles = {line.get_label(): line for ax in axes for line in ax.get_lines()}
    fig.legend(handles=list(handles.values()), loc="outside lower center", ncol=min(len(handles), int(width // 3.3)),
               fontsize=9, handlelength=3.5)
    fig.suptitle("Emulated training: test accuracy against virtual time", fontsize=12, fontweight="bold")
    return fig
