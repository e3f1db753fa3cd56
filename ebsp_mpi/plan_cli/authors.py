"""``python -m ebsp_mpi plan --osdp-profile FILE --blocks B --hidden H --memory-mb L``: the OSDP authors'
planning problem on their GPT-block profile, solved exactly (:mod:`ebsp_mpi.plan.osdp_authors`).

Kept apart from planning a job (:mod:`.plan`): it reads the authors' profile, not one of ours, and plans
no layer of this project's models; it is a test vector for OSDP's idea, on the authors' own numbers.
"""

from __future__ import annotations

import json
from ..safe_text import integer


def add_arguments(p) -> None:
    """The options of the authors' problem, on the ``plan`` parser (``--osdp-profile`` chooses it)."""
    authors = p.add_argument_group("the OSDP authors' problem")
    authors.add_argument("--osdp-profile", metavar="FILE", help="the authors' profile (gpt_block_profile.json)")
    authors.add_argument("--blocks", type=integer, metavar="B", help="transformer blocks")
    authors.add_argument("--hidden", type=integer, metavar="H", help="hidden size (one of the profile's)")
    authors.add_argument("--memory-mb", type=integer, metavar="L", help="device memory in MB")
    authors.add_argument("--row", type=integer, metavar="R", help="batch row (default: the row of most samples/s)")
    authors.add_argument("--row-batches", metavar="N,N,...",
                         help="batch of each row, for samples/s (default: the row number, as the authors' "
                              "scheduler labels it)")


def main(args) -> int:
    from ..errors import UsageError
    from ..plan import osdp_authors as a

    if args.job or args.memory_limit or args.profile:
        raise UsageError("--osdp-profile solves the authors' problem: give no JOB, --memory-limit or --profile")
    missing = [name for name, v in (("--blocks", args.blocks), ("--hidden", args.hidden),
                                    ("--memory-mb", args.memory_mb)) if v is None]
    if missing:
        raise UsageError(f"--osdp-profile needs {', '.join(missing)} (e.g. --blocks 48 --hidden 1536 --memory-mb 8192)")
    if args.blocks < 1 or args.memory_mb < 1:
        raise UsageError(f"--blocks {args.blocks} --memory-mb {args.memory_mb}: both must be >= 1")
    profile = a.read_profile(args.osdp_profile)
    if args.row is not None:
        result = a.solve(profile, args.blocks, args.hidden, args.memory_mb, args.row).as_dict()
    else:
        rows = a.rows_of(profile)
        batches = _row_batches(args.row_batches, rows) if args.row_batches else list(range(rows))
        best, solutions = a.best_row(profile, args.blocks, args.hidden, args.memory_mb, batches)
        authors = a.authors_row(profile, args.blocks, args.hidden, args.memory_mb)
        budget = args.memory_mb - int(profile.get("extra_overhead_mb", 800))
        result = best.as_dict() if best else {"feasible": False, "row": None, "budget_mb": budget}
        if best:
            result["samples_per_s"] = batches[best.row] / best.time_s
        result["authors_rule_row"] = authors.row if authors else None
        result["rows"] = [dict(s.as_dict(), batch=batches[s.row],
                               **({"samples_per_s": batches[s.row] / s.time_s} if s.feasible else {}))
                          for s in solutions]
    if args.json:
        print(json.dumps(result, indent=1))
    else:
        _print_authors(result, args)
    return 0


def _row_batches(text: str, rows: int) -> list[float]:
    from ..errors import UsageError

    try:
        values = [float(part) for part in text.split(",")]
    except ValueError:
        values = []
    if len(values) != rows or any(not v >= 0 for v in values):
        raise UsageError(f"--row-batches {text!r}: expected {rows} numbers >= 0, one per row")
    return values


def _print_authors(result: dict, args) -> None:
    print(f"{args.blocks} blocks, hidden {args.hidden}, {args.memory_mb} MB (budget {result['budget_mb']} MB)")
    for r in result.get("rows", [result]):
        if r["feasible"]:
            counts = ", ".join(f"{k} {n}" for k, n in r["strategy_counts"].items())
            print(f"row {r['row']}: {r['time_s']:.6f} s, {r['memory_mb']} MB; {counts}")
        else:
            print(f"row {r['row']}: infeasible")
    if "authors_rule_row" in result:
        print(f"most samples/s: row {result['row']}; the authors' rule (least summed time over rows 1-3 up to the "
              f"first infeasible): row {result['authors_rule_row']}")
