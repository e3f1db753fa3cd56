"""What a run was made from, recorded so that ``train --resume`` and ``simulate --replay`` can check it
before they use it (docs/reliability.md, "Run identity").

Four pieces, :data:`PIECES`:

- ``run``: a random id made when the run starts; its checkpoint, every rank's trace and its summary
  carry it, so that a file of another run put in its directory is named, not appended to;
- ``job``: the SHA-256 of the resolved job as canonical JSON, less the keys a resumed run may change
  (``stop.*``, ``checkpoint.*``);
- ``data``: per dataset file (by its base name) its fingerprint (``data.fingerprint``: its size and
  sampled blocks, cheap on a large file, and it catches a replaced one);
- ``code``: the package version and the SHA-256 of the package's Python sources (a git commit would
  miss uncommitted edits, and an installed wheel has none).

A piece that differs is refused in one line naming it and both values, unless the user accepts it
(``--accept-mismatch PIECE[,PIECE]``); what was accepted is recorded (``Identity.accepted``) and
goes into every later checkpoint and the summary. A run recorded before these records existed has
none: each piece it lacks counts as differing (``not recorded``) and needs the flag.

Pure: no MPI.
"""

from __future__ import annotations

import hashlib
import json
import uuid
from dataclasses import dataclass, field, replace
from functools import lru_cache
from pathlib import Path

from . import __version__
from .errors import UsageError

PIECES = ("run", "job", "data", "code")
#: what each piece is, for the messages
NAMES = {"run": "run id", "job": "job", "data": "dataset", "code": "code version"}
#: keys a resumed run may change without changing what it is (``checkpoint.RESUMABLE_CHANGES``)
FREE_KEYS = ("stop", "checkpoint")
NOT_RECORDED = "not recorded"


@dataclass(frozen=True)
class Identity:
    """A run's identity (the module docstring); a piece a run did not record is None."""

    run_id: str | None
    job: str | None
    data: dict | None
    code: str | None
    #: piece -> {"recorded": value, "now": value}: mismatches the user accepted, this run and earlier
    accepted: dict = field(default_factory=dict)

    def value(self, piece: str):
        return {"run": self.run_id, "job": self.job, "data": self.data, "code": self.code}[piece]

    def as_dict(self) -> dict:
        return {"run_id": self.run_id, "job": self.job, "data": self.data, "code": self.code,
                "accepted": self.accepted}

    @classmethod
    def from_dict(cls, doc) -> Identity:
        """The identity recorded in `doc` (a summary's or a checkpoint's); an empty one where `doc` is
        not a dict (a run recorded before identities)."""
        doc = doc if isinstance(doc, dict) else {}
        text = {k: doc.get(k) if isinstance(doc.get(k), str) else None for k in ("run_id", "job", "code")}
        data = doc.get("data")
        accepted = doc.get("accepted")
        return cls(run_id=text["run_id"], job=text["job"], code=text["code"],
                   data=data if isinstance(data, dict) else None,
                   accepted=accepted if isinstance(accepted, dict) else {})


def new_run_id() -> str:
    return uuid.uuid4().hex[:16]


def job_fingerprint(config: dict) -> str:
    """SHA-256 (16 hex digits) of a resolved job (``config.to_dict``) less :data:`FREE_KEYS`."""
    kept = {k: v for k, v in config.items() if k not in FREE_KEYS}
    return hashlib.sha256(json.dumps(kept, sort_keys=True).encode()).hexdigest()[:16]


def data_fingerprint(config: dict) -> dict:
    """Base name -> fingerprint of every file the job's dataset reads (``data.fingerprint``)."""
    from .data.fingerprint import dataset_fingerprint

    data = config.get("data", {})
    if data.get("name") == "mnist1d":
        return _mnist1d_key(data.get("samples", 0))
    files = dataset_fingerprint(data.get("name", ""), data.get("root", ""), data.get("path", ""))
    return {Path(path).name: fp for path, fp in files.items()}


def _mnist1d_key(samples) -> dict:
    """MNIST-1D is generated, not read: its identity is the cache file's name, which hashes every
    generator argument and the generator's version (``data.mnist1d.cache_name``)."""
    from .data.errors import DatasetError
    from .data.mnist1d import cache_name, generator_arguments

    try:
        args = generator_arguments(samples)
    except DatasetError:
        return {"mnist1d": "generator not installed"}  # the loader refuses the run in one line
    return {cache_name(args): "generated"}


@lru_cache(maxsize=1)
def code_version() -> str:
    """``<package version>+<12 hex digits>``: the SHA-256 of every ``.py`` file of the package, by path."""
    package = Path(__file__).resolve().parent
    digest = hashlib.sha256()
    for path in sorted(package.rglob("*.py")):
        digest.update(str(path.relative_to(package)).encode() + b"\0")
        digest.update(path.read_bytes() + b"\0")
    return f"{__version__}+{digest.hexdigest()[:12]}"


def current(config: dict, run_id: str | None = None, accepted: dict | None = None) -> Identity:
    """The identity of a run of the resolved job `config` made now, with this code and these files."""
    return Identity(run_id=run_id, job=job_fingerprint(config), data=data_fingerprint(config),
                    code=code_version(), accepted=dict(accepted or {}))


def parse_accepted(text: str | None) -> frozenset[str]:
    """The pieces of ``--accept-mismatch PIECE[,PIECE]`` (``all``: every piece); one line otherwise."""
    if not text:
        return frozenset()
    pieces = {p.strip() for p in text.split(",")}
    if pieces == {"all"}:
        return frozenset(PIECES)
    unknown = sorted(pieces - set(PIECES))
    if unknown:
        raise UsageError(f"--accept-mismatch {text!r}: {', '.join(map(repr, unknown))} is not a piece; expected "
                         f"a comma-separated list of {', '.join(PIECES)}, or all")
    return frozenset(pieces)


def show(piece: str, value) -> str:
    """A piece's value as a message gives it."""
    if value is None:
        return NOT_RECORDED
    if piece == "data":
        return ", ".join(f"{name} {fp}" for name, fp in sorted(value.items())) or "no files"
    return str(value)


def _data_difference(then: dict, now: dict) -> tuple[str, str]:
    """The first file whose fingerprint differs, as (then, now) texts."""
    for name in sorted(set(then) | set(now)):
        if then.get(name) != now.get(name):
            return f"{name} {then.get(name, 'absent')}", f"{name} {now.get(name, 'absent')}"
    return show("data", then), show("data", now)


def mismatch_line(where: str, piece: str, then, now, detail: str = "") -> str:
    """The one line that refuses a differing piece, naming it and both values."""
    if piece == "data" and then is not None and now is not None:
        a, b = _data_difference(then, now)
    else:
        a, b = show(piece, then), show(piece, now)
    return (f"{where}: the {NAMES[piece]} differs from the run's{detail}: it was {a}, it is {b} now; put back what "
            f"the run was made from, or give --accept-mismatch {piece} to go on with this (the summary records it)")


def check(where: str, recorded: Identity, now: Identity, accept: frozenset[str], pieces=PIECES,
          details: dict | None = None) -> dict:
    """Compare `pieces` of `recorded` with `now`: the first differing piece not in `accept` is refused
    (:func:`mismatch_line`); returns the accepted ones, piece -> {"recorded", "now"}. `details`: per
    piece, words the message adds (the job's differing keys)."""
    accepted = {}
    for piece in pieces:
        then, value = recorded.value(piece), now.value(piece)
        if then == value:
            continue
        if piece not in accept:
            raise UsageError(mismatch_line(where, piece, then, value, (details or {}).get(piece, "")))
        accepted[piece] = {"recorded": then, "now": value}
    return accepted


def continued(recorded: Identity, now: Identity, accepted: dict) -> Identity:
    """The identity a resumed run goes on with: the recorded run id (a new one where none was recorded
    and the user accepted that), the pieces as they are now, and every mismatch accepted so far."""
    return replace(now, run_id=recorded.run_id or new_run_id(), accepted={**recorded.accepted, **accepted})
