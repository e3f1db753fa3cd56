"""The arguments ``profile`` and ``plan JOB`` share."""

from __future__ import annotations

import argparse


def add_job_arguments(p: argparse.ArgumentParser, out: str, what: str) -> None:
    """JOB, ``--set`` and ``--out`` (default `out`, a file of `what`), as ``profile`` and ``plan JOB`` take them."""
    p.add_argument("job", nargs="?", metavar="JOB.toml", help="job file (default: the embedded default job)")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="override a job key (repeatable)")
    p.add_argument("--out", metavar="FILE", default=out, help=f"{what} file (default {out})")
