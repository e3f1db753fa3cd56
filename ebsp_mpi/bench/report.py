"""What every benchmark hands back: records of a figure beside its reference, printed as a table.

A record compares one measured figure with a peer measured in the same run on the same machine:

``{"kind", "case", "figure", "unit", "reference", "reference_figure", "ratio"}``

``ratio`` is always ``figure / reference_figure`` in ``unit``: above 1 means more bytes per second
for a throughput (``B/s``, ``samples/s``), more seconds for a time (``s``). Standard library only.
"""

from __future__ import annotations

import json
import statistics
import time
from collections.abc import Callable
from pathlib import Path

KEYS = ("kind", "case", "figure", "unit", "reference", "reference_figure", "ratio")


def record(kind: str, case: str, figure: float, unit: str, reference: str, reference_figure: float) -> dict:
    """One comparison; `unit` is ``"B/s"`` or ``"s"``, the same for the figure and its reference."""
    figure, reference_figure = float(figure), float(reference_figure)
    return {"kind": kind, "case": case, "figure": figure, "unit": unit, "reference": reference,
            "reference_figure": reference_figure,
            "ratio": figure / reference_figure if reference_figure else float("nan")}


def median_seconds(fn: Callable[[], object], reps: int, warmup: int = 1) -> float:
    """Median wall seconds of ``fn()`` over `reps` calls after `warmup` untimed ones."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def alternate(fns: list[Callable[[], object]], reps: int, warmup: int = 1) -> list[float]:
    """Median wall seconds of each of `fns`, called in turn `reps` times after `warmup` rounds.

    Timing them alternately lets a change of load on the machine hit every one alike.
    """
    for _ in range(warmup):
        for fn in fns:
            fn()
    times: list[list[float]] = [[] for _ in fns]
    for _ in range(reps):
        for fn, ts in zip(fns, times, strict=True):
            t = time.perf_counter()
            fn()
            ts.append(time.perf_counter() - t)
    return [statistics.median(ts) for ts in times]


def human(value: float, unit: str) -> str:
    """``1.23 GB/s``, ``45.6 us``: a figure scaled for reading (decimal prefixes for bytes)."""
    if unit == "B/s":
        for scale, prefix in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
            if abs(value) >= scale:
                return f"{value / scale:.2f} {prefix}B/s"
        return f"{value:.0f} B/s"
    if unit == "s":
        for scale, name in ((1.0, "s"), (1e-3, "ms"), (1e-6, "us")):
            if abs(value) >= scale:
                return f"{value / scale:.3g} {name}"
        return f"{value / 1e-9:.3g} ns"
    if abs(value) >= 1000:
        return f"{value:,.0f} {unit}"
    return f"{value:.4g} {unit}"


def size_label(nbytes: int) -> str:
    """``4 KiB``, ``64 MiB``: a message size in binary units."""
    for shift, name in ((30, "GiB"), (20, "MiB"), (10, "KiB")):
        if nbytes >= 1 << shift and nbytes % (1 << shift) == 0:
            return f"{nbytes >> shift} {name}"
    return f"{nbytes} B"


def parse_size(text: str) -> int:
    """``4K``, ``64MiB``, ``1e6``, ``4096`` -> an integer (binary multiples for K, M, G)."""
    t = text.strip().upper().removesuffix("IB").removesuffix("B")
    factor = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(t[-1:], 1)
    number = t[:-1] if factor > 1 else t
    try:
        value = float(number) * factor
    except ValueError:
        raise ValueError(f"size {text!r}: expected a number with an optional K, M or G suffix") from None
    if value < 1 or value != int(value):
        raise ValueError(f"size {text!r}: must be a whole number >= 1")
    return int(value)


def parse_sizes(text: str) -> list[int]:
    """A comma-separated list of sizes (see :func:`parse_size`)."""
    return [parse_size(part) for part in text.split(",") if part.strip()]


def print_table(title: str, rows: list[dict], targets: dict | None = None) -> None:
    """Print `rows` (records) as ``case | figure | reference | ratio [| target]``.

    `targets` maps a case to ``(">=" or "<=", value)``; a row with a target shows whether it is met.
    """
    targets = targets or {}
    print(title)
    width = max([len(r["case"]) for r in rows] + [4])
    ref_width = max([len(r["reference"]) for r in rows] + [9])
    head = (f"{'case':<{width}} | {'figure':>12} | {'reference':<{ref_width}} {'figure':>12} | "
            f"{'ratio':>7} | target")
    print(head)
    print("-" * len(head))
    for r in rows:
        mark = ""
        if r["case"] in targets:
            op, value = targets[r["case"]]
            met = r["ratio"] >= value if op == ">=" else r["ratio"] <= value
            mark = f"{op} {value:g} {'yes' if met else 'NO'}"
        print(f"{r['case']:<{width}} | {human(r['figure'], r['unit']):>12} | {r['reference']:<{ref_width}} "
              f"{human(r['reference_figure'], r['unit']):>12} | {r['ratio']:7.3f} | {mark}")
    print()


def write_json(path: str | Path, records: list[dict]) -> None:
    """Write `records` as a JSON list (``--json FILE``)."""
    Path(path).write_text(json.dumps(records, indent=1) + "\n")
