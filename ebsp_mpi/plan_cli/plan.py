"""``python -m ebsp_mpi plan``: OSDP's plan for a job under a memory limit, or the authors' problem.

- ``plan JOB --memory-limit SIZE [--profile FILE] [--out plan.json]``: per layer resident, on-demand
  or split in slices, maximising samples per second under the limit (:mod:`ebsp_mpi.plan.osdp`), from
  a profile (``python -m ebsp_mpi profile``; without ``--profile`` the job is profiled first, with the
  same options). Prints the plan per layer and its predicted peak memory, iteration time and samples
  per second, and writes the plan file a job names with ``osdp.plan``.
- ``plan --osdp-profile FILE --blocks B --hidden H --memory-mb L [--row R] [--json]``: the OSDP
  authors' planning problem on their GPT-block profile, solved exactly (:mod:`.authors`).
"""

from __future__ import annotations

import json
import sys

DEFAULT_OUT = "plan.json"


def add_parser(subparsers) -> None:
    """Register ``plan`` on the CLI's subparsers (``ebsp_mpi.cli``)."""
    from ..helptext import plain
    from . import authors
    from .arguments import add_job_arguments
    from .profile import add_profile_options

    p = subparsers.add_parser("plan", help="OSDP: per layer resident, on-demand or split under a memory limit "
                                           "(or the authors' problem with --osdp-profile)",
                              description=plain(__doc__.split("\n\n")[0]))
    add_job_arguments(p, DEFAULT_OUT, "plan")
    p.add_argument("--memory-limit", metavar="SIZE", help="per-worker memory limit, e.g. 512MiB, 2GB, 100000")
    p.add_argument("--profile", metavar="FILE", help="profile from python -m ebsp_mpi profile (default: profile now)")
    add_profile_options(p)
    authors.add_arguments(p)
    p.add_argument("--json", action="store_true", help="print the result as JSON")
    p.add_argument("-q", "--quiet", action="store_true", help="no progress output")
    p.set_defaults(run=main)


def main(args) -> int:
    if args.osdp_profile:
        from . import authors

        return authors.main(args)
    return _job(args)


def _job(args) -> int:
    from .. import build
    from ..config import load_job
    from ..errors import UsageError
    from ..plan import osdp
    from ..plan.osdp_files import (check_profile_fits, check_profile_splits, cost_models, model_layers,
                                  plan_document, read_profile, write_json)
    from .profile import parse_splits
    from ..plan.sizes import parse_size

    if args.blocks is not None or args.hidden is not None or args.memory_mb is not None or args.row is not None:
        raise UsageError("--blocks, --hidden, --memory-mb and --row belong to the authors' problem: give "
                         "--osdp-profile FILE too, or plan a job with --memory-limit SIZE")
    if not args.memory_limit:
        raise UsageError("plan JOB needs --memory-limit SIZE, the memory of one worker (e.g. 512MiB, 2GB)")
    try:
        limit = parse_size(args.memory_limit, "--memory-limit")
    except ValueError as e:
        raise UsageError(str(e)) from None
    splits = parse_splits(args.splits)
    job = load_job(args.job, args.overrides)
    if args.profile:
        from .profile import _seconds, parse_batch_sizes

        profile = read_profile(args.profile)
        layers = model_layers(build.model(job, build.dataset(job)))
        check_profile_fits(profile, layers, f"--profile {args.profile}")
        check_profile_splits(profile, splits, f"--profile {args.profile}")
        sizes = parse_batch_sizes(args.batch_sizes) if args.batch_sizes else None
        overhead = _seconds(args.overhead, "--overhead") if args.overhead is not None else None
        profile = _network_given(profile, args)
    else:
        from .profile import run_profile

        profile = run_profile(job, args)
        sizes, overhead = None, None
    models = cost_models(profile, sizes, overhead)
    try:
        best = osdp.plan(models, limit, splits)
    except osdp.Infeasible as e:
        s = e.smallest
        raise UsageError(f"--memory-limit {args.memory_limit}: no plan fits in {_size(limit)}; the smallest limit "
                         f"that fits is {_size(s.peak_bytes)} ({s.peak_bytes} bytes: batch {s.batch}, "
                         f"{_choices(s, models)})") from None
    cm = next(m for m in models if m.batch == best.batch)
    doc = plan_document(best, cm, profile, limit, splits)
    write_json(args.out, doc)
    if args.json:
        print(json.dumps(doc, indent=1))
    else:
        print_plan(best, cm, models, limit)
        print(f"wrote {args.out}: train with --set osdp.plan={args.out}"
              + (f" --set data.batch_size={best.batch}" if best.batch != job.data.batch_size else ""))
    return 0


def _network_given(profile: dict, args) -> dict:
    """The profile with the network the options give instead of its own (``--bench``, or just the
    ``--latency`` or ``--bandwidth`` given, and ``--overlap``): e.g. a latency measured on runs."""
    from .profile import network_options

    net = dict(profile["network"])
    if args.bench:
        net.update(network_options(args))
    elif args.latency or args.bandwidth:  # only what is given: the profile keeps the rest
        given = network_options(args)
        if args.latency:
            net["latency_s"] = given["latency_s"]
        if args.bandwidth:
            net["bandwidth_bytes_per_s"] = given["bandwidth_bytes_per_s"]
        net["source"] = f"{net.get('source')}, overridden by options"
    if args.overlap:
        net["overlap"] = args.overlap == "yes"
    return {**profile, "network": net}


def print_plan(best, cm, models, limit: int, out=None) -> None:
    """The plan per layer, its peak memory by part, and its time against all-resident."""
    from ..plan import osdp

    out = out or sys.stdout
    sizes = ", ".join(str(m.batch) for m in models)
    print(f"OSDP plan under {_size(limit)} per worker: batch {best.batch} (of {sizes})", file=out)
    head = f"{'layer':<10} {'params':>10} {'weights':>10}  {'choice':<10} {'largest unit':>12}"
    print(head, file=out)
    print("-" * len(head), file=out)
    for block, s in zip(cm.blocks, best.choices, strict=True):
        unit = _size(max(cm.unit_bytes(block, s))) if s != osdp.RESIDENT else ""
        print(f"{block.name:<10} {block.params:>10} {_size(cm.weight_bytes(block)):>10}  {osdp.describe(s):<10} "
              f"{unit:>12}", file=out)
    m = best.memory
    print(f"predicted peak memory: {_size(m.total)} = resident {_size(m.resident)} + fetch buffer "
          f"{_size(m.buffer)} + split temporary {_size(m.split_temp)} + input gradient {_size(m.input_grad)} + "
          f"activations {_size(m.activations)}", file=out)
    print(f"predicted iteration: {best.iteration_s * 1e3:.3f} ms, {best.samples_per_s:.1f} samples/s "
          f"({osdp.category(best.choices)})", file=out)
    resident = osdp.all_resident(cm)
    print(f"all resident at batch {cm.batch}: {_size(resident.peak_bytes)}, {resident.iteration_s * 1e3:.3f} ms, "
          f"{resident.samples_per_s:.1f} samples/s" + ("" if resident.peak_bytes <= limit else " (does not fit)"),
          file=out)


def _choices(p, models) -> str:
    from ..plan import osdp

    cm = next(m for m in models if m.batch == p.batch)
    return ", ".join(f"{b.name} {osdp.describe(s)}" for b, s in zip(cm.blocks, p.choices, strict=True))


def _size(nbytes: float) -> str:
    from ..plan.sizes import format_size

    return format_size(nbytes)
