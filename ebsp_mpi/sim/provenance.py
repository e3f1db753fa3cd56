"""What ``simulate --replay RUN`` checks of the run it replays before it reads it, and what an exact
replay claims (docs/reliability.md, "Run identity").

- The run: every trace file of RUN and its summary must carry one run id (``ebsp_mpi.identity``): a
  rank file of another run would lend the replay its times. This one is refused even with
  ``--accept-mismatch run``: the trace reader leaves such a file out (``trace.reader``), so there is
  no replay of it to go on with.
- With ``--train``, the dataset files and the code must be those the run was made from: the replay's
  weights are computed from them, and its claim to be exact (``exact_replay``) is that they equal the
  live run's.

A piece that differs is refused in one line naming it and both values, unless ``--accept-mismatch``
names it; the replay then runs, and is never called exact: ``exact_replay`` is false and
``exact_replay_reason`` says why. The job is the user's to choose (JOB and ``--set`` change it on
purpose, to ask what another model would have done): it is not refused, but a job that differs from
the recorded one in what the weights depend on makes the replay not exact, and the reason names the
keys.
"""

from __future__ import annotations

import json
from pathlib import Path

import h5py

from .. import identity
from ..config import JobConfig, to_dict
from ..errors import UsageError

#: keys of the job the weights depend on: a replay whose job differs in one is not exact
#: (``sync.workers`` is the replay's to set; the rest changes times, files or limits, not the weights)
TRAINING_KEYS = ("seed", "model.", "data.", "optim.", "sync.", "comm.", "osdp.")
FREE_KEYS = ("sync.workers",)


def check_replay(run_dir, job: JobConfig, *, train: bool, accept: frozenset) -> tuple[dict, list[str]]:
    """Check the run `run_dir` that a replay of `job` reads (the module docstring); returns the
    mismatches accepted (piece -> {"recorded", "now"}) and the reasons the replay is not exact."""
    run_dir = Path(run_dir)
    where = f"simulate --replay {run_dir}"
    summary = _summary(run_dir)
    _check_run_ids(where, run_dir, summary)
    accepted, reasons = {}, []
    if train:
        recorded = identity.Identity.from_dict(summary.get("identity"))
        accepted.update(identity.check(where, recorded, identity.current(to_dict(job)), accept,
                                       pieces=("data", "code")))
        changed = _training_keys_changed(summary.get("config"), to_dict(job))
        if changed:
            reasons.append(f"the job differs from the recorded one in {', '.join(changed)}")
    reasons += [f"the {identity.NAMES[piece]} differs from the run's ({identity.show(piece, v['recorded'])} "
                f"recorded, {identity.show(piece, v['now'])} now), accepted by --accept-mismatch"
                for piece, v in accepted.items()]
    return accepted, reasons


def _summary(run_dir: Path) -> dict:
    try:
        doc = json.loads((run_dir / "summary.json").read_text())
    except (OSError, ValueError):
        return {}
    return doc if isinstance(doc, dict) else {}


def _check_run_ids(where: str, run_dir: Path, summary: dict) -> None:
    """Every trace file of the run carries the summary's run id (or, without one in the summary, the
    first file's)."""
    found = []
    for path in sorted((run_dir / "trace").glob("*.h5")):
        try:
            with h5py.File(path, "r") as f:
                run_id = f.attrs.get("run_id")
        except OSError:
            continue  # the replay's reader names a file it cannot read
        found.append((path, run_id.decode() if isinstance(run_id, bytes) else run_id))
    expected = summary.get("run_id") if isinstance(summary.get("run_id"), str) else None
    if expected is None and found:
        expected = found[0][1]
    for path, run_id in found:
        if run_id != expected:
            raise UsageError(f"{where}: the run id differs from the run's ({path}): it was {expected}, it is "
                             f"{run_id} now; a replay reads one run's files: put back this run's own file")


def _training_keys_changed(recorded, now: dict) -> list[str]:
    from ..checkpoint import _differing_keys

    if not isinstance(recorded, dict):
        return ["every key (the run's job is not recorded)"]
    return [key for key in _differing_keys(recorded, now)
            if key.startswith(TRAINING_KEYS) and key not in FREE_KEYS]
