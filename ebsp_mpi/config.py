"""The job schema: dataclasses, TOML loading, ``--set key=value`` overrides and validation.

A job is a TOML file whose tables mirror the dataclasses below (``[model]``, ``[data]``, ``[optim]``,
``[sync]``, ``[stop]``, ``[eval]``, ``[straggler]``, ``[runtime]``, ``[trace]``, ``[checkpoint]``,
``[osdp]``); every key can be overridden with ``--set section.key=value``. Every value is checked
against its field's type and range, and an error names the key, the value and what is allowed (:class:`ConfigError`).

Only the standard library is imported here (``tomllib``, or ``tomli`` on Python 3.10), and
``ebsp_mpi.straggler``, whose classes check slow phases and per-worker factors without loading NumPy;
so the CLI validates a job before NumPy, h5py or MPI are loaded. The values a key allows are the names
the code that acts on them registers (``sync.registry.POLICIES``, ``data.DATASETS``, ...); config.py
cannot import those modules, so a test holds the two lists equal.
"""

from __future__ import annotations

import dataclasses
import difflib
import math
import sys
import typing
from dataclasses import dataclass, field
from pathlib import Path

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on Python 3.10 only
    import tomli as tomllib

from .errors import UsageError
from .plan.hybcomm import SFB_OVERHEAD_BYTES
from .straggler import SlowPhase, straggler_model


class ConfigError(UsageError, ValueError):
    """A job value that is unknown, of the wrong type or out of range (one line, for a person)."""


def _opt(default, help: str, **rules):
    """A field with a help text and validation rules (choices, min, max, gt)."""
    if isinstance(default, (list, dict)):
        return field(default_factory=lambda: type(default)(default), metadata={"help": help, **rules})
    return field(default=default, metadata={"help": help, **rules})


@dataclass
class ModelConfig:
    kind: str = _opt("mlp", "network: mlp (dense layers), cnn (LeNet-like) or cnn1d (MNIST-1D's: convolutions "
                            "along the last axis, stride 2, then a linear classifier)", choices=("mlp", "cnn", "cnn1d"))
    hidden: list[int] = _opt([128], "hidden layer widths (mlp); cnn uses hidden[0] for its dense layer, cnn1d none",
                             min=1, nonempty=True)
    channels: list[int] = _opt([8, 16], "output channels of each conv block (cnn: 3x3; cnn1d: kernels)", min=1,
                               nonempty=True)
    kernels: list[int] = _opt([5, 3, 3], "cnn1d: kernel width of each conv block (the last repeats)", min=1,
                              nonempty=True)


@dataclass
class DataConfig:
    name: str = _opt("digits", "dataset", choices=("digits", "mnist", "fashion-mnist", "cifar10", "hdf5",
                                                   "synthetic", "mnist1d"))
    root: str = _opt("", "directory with the dataset files (mnist, fashion-mnist, cifar10); mnist1d: of its "
                         "generated cache (empty: $XDG_CACHE_HOME/ebsp-mpi, default ~/.cache/ebsp-mpi)")
    path: str = _opt("", "HDF5 file with datasets x and y (hdf5)")
    batch_size: int = _opt(32, "minibatch size per worker", min=1)
    test_fraction: float = _opt(0.2, "share held out for testing where a dataset has no test split",
                                gt=0.0, max=0.9)
    normalize: bool = _opt(True, "standardise inputs with the training split's statistics")
    max_train: int = _opt(0, "keep only this many training samples (0: all)", min=0)
    samples: int = _opt(5000, "mnist1d: samples generated, a multiple of 10 (the published 5000: 4000 train, "
                              "1000 test)", min=10)
    synthetic_samples: int = _opt(10000, "synthetic: number of samples", min=10)
    synthetic_features: int = _opt(64, "synthetic: input features", min=1)
    synthetic_classes: int = _opt(10, "synthetic: classes", min=2)
    synthetic_hidden: int = _opt(64, "synthetic: hidden width of the labelling teacher network", min=1)


@dataclass
class OptimConfig:
    lr: float = _opt(0.05, "learning rate", gt=0.0)
    momentum: float = _opt(0.9, "momentum factor", min=0.0, max=0.999)
    nesterov: bool = _opt(False, "Nesterov momentum")
    weight_decay: float = _opt(0.0, "L2 weight decay", min=0.0)
    schedule: str = _opt("constant", "learning-rate schedule", choices=("constant", "step", "cosine"))
    warmup_steps: int = _opt(0, "linear warm-up over this many optimizer steps", min=0)
    step_size: int = _opt(1000, "step schedule: steps between decays", min=1)
    gamma: float = _opt(0.1, "step schedule: decay factor", gt=0.0, max=1.0)
    min_lr: float = _opt(0.0, "cosine schedule: final learning rate", min=0.0)
    total_steps: int = _opt(0, "cosine schedule: length in optimizer steps (0: derive from stop.iterations)",
                            min=0)
    staleness: str = _opt("none", "staleness-aware updates of stale pushes: none, scale (lr / staleness) or dc "
                                  "(DC-ASGD's delay compensation)", choices=("none", "scale", "dc"))
    dc_lambda: float = _opt(0.04, "dc: lambda of g + lambda * g * g * (w_now - w_pulled)", min=0.0)


@dataclass
class SyncConfig:
    model: str = _opt("bsp", "synchronization model", choices=("bsp", "asp", "ssp", "dssp", "elasticbsp", "psp"))
    workers: int = _opt(0, "workers; 0 = auto (world size 1: one worker; under MPI: world size - runtime.servers). At "
                           "world size 1, n > 1 averages the batches n BSP workers would draw (the oracle)",
                        min=0)
    staleness: int = _opt(3, "SSP/DSSP/PSP: staleness bound s (iterations)", min=0)
    dssp_range: int = _opt(3, "DSSP: the threshold moves in [s, s + r]; this is r", min=0)
    lookahead: int = _opt(15, "ElasticBSP: lookahead R (predicted pushes per worker ZipLine chooses from)",
                          min=1)
    penalty: float = _opt(0.0, "ElasticBSP: lambda, weight of the superstep length against the spread", min=0.0)
    predictor: str = _opt("last", "ElasticBSP: push-time predictor (last interval, EMA of intervals, or median "
                                  "of the last 5)", choices=("last", "ema", "median"))
    ema_alpha: float = _opt(0.5, "ElasticBSP: smoothing of the ema predictor", gt=0.0, max=1.0)
    zipline_z: float | str = _opt(0.0, "ElasticBSP: barriers chosen on the predictions +- z learned error scales "
                                       "(0: the paper's ZipLine; \"auto\": z picked online from the waiting)",
                                  min=0.0, words=("auto",))
    overdue: str = _opt("none", "ElasticBSP: a worker whose predicted next push lies before the decision "
                                "(\"widen\": predicted with the time since its last push as its interval; "
                                "\"none\": the paper's)", choices=("none", "widen"))
    replan: str = _opt("none", "ElasticBSP: when a member's late push shows the held members will wait longer "
                               "than the barrier promised (\"overdue\": ZipLine again over the rest of the "
                               "lookahead, the barrier moved if that promises less waiting; \"none\": the "
                               "paper's)", choices=("none", "overdue"))
    sample: int = _opt(2, "PSP: other workers each barrier samples (beta); its staleness bound is "
                          "sync.staleness; beta >= workers - 1 is SSP", min=1)


@dataclass
class StopConfig:
    iterations: int = _opt(0, "stop after this many iterations per worker (0: no limit)", min=0)
    epochs: float = _opt(30.0, "stop after this many passes over each worker's shard (0: no limit)", min=0.0)
    seconds: float = _opt(0.0, "stop after this many wall seconds (0: no limit)", min=0.0)


@dataclass
class EvalConfig:
    every_seconds: float = _opt(0.1, "evaluate on the test split every this many wall seconds", gt=0.0)
    targets: list[float] = _opt([0.9, 0.95], "test accuracies whose first time goes into time_to_accuracy",
                                gt=0.0, max=1.0)
    batch_size: int = _opt(512, "samples per evaluation slice (the server serves messages between slices)",
                           min=1)
    divergence_evals: int = _opt(5, "warn (once) that training diverged when test accuracy stays at chance this "
                                    "many evaluations of new weights in a row (0: never)", min=0)
    divergence_loss_factor: float = _opt(10.0, "warn (once) that training diverged when the test loss grows this "
                                               "factor above its lowest (0: never)", min=0.0)


@dataclass
class StragglerConfig:
    enabled: bool = _opt(True, "false turns every injected slowdown off")
    slowdown: list[float] = _opt([], "compute slowdown factor per worker (worker k is rank k + runtime.servers); "
                                     "missing = 1", gt=0.0)
    jitter_sigma: float = _opt(0.0, "sigma of log-normal jitter on each iteration's compute time", min=0.0)
    base_s: float = _opt(0.0, "seconds added to every iteration's compute (emulates a heavier model)", min=0.0)
    spread: float = _opt(1.0, "speeds spread log-uniformly over this ratio: worker k's slowdown times "
                              "spread**U(k), U(k) uniform in [0, 1) seeded by the job seed (1: none)", min=1.0)
    phases: list[dict] = _opt([], "transient slow phases: [{worker = k, t1 = s, t2 = s, factor = f}, ...]")


@dataclass
class RuntimeConfig:
    stall_timeout_s: float = _opt(60.0, "abort when a rank that owes a message has been silent this many seconds",
                                  gt=0.0)
    setup_timeout_s: float = _opt(600.0, "abort when a rank has not finished setting up (data, model, traces) this "
                                         "many seconds after rank 0 has", gt=0.0)
    servers: int = _opt(1, "server ranks: ranks 0..servers-1 hold the parameters in shards (rank 0 also schedules), "
                           "the rest are workers", min=1)
    servers_alone: bool = _opt(False, "refuse to start when the launcher put a worker on a node that runs a server "
                                      "(the servers' links and cores their own)")
    cuda_aware_mpi: bool = _opt(False, "send device buffers directly (needs a CUDA-aware MPI)")
    chunk_bytes: int = _opt(0, "largest message: bigger tensors go in chunks of this many bytes (>= 1024); "
                               "0: 512 KiB where every rank has a core, else 4 MiB", min=0)
    wait_free_backprop: bool = _opt(True, "push each gradient chunk as soon as the backward pass has written it "
                                          "(Poseidon's WFBP), not after the whole backward pass")
    stream_rounds: bool | str = _opt("auto", "BSP: apply and send back each chunk of a round once every worker "
                                             "of the round has pushed it, while later chunks still arrive; false: "
                                             "once every push is whole; \"auto\": where a worker is on another "
                                             "node than its server", words=("auto",))
    shared_pushes: bool = _opt(True, "a worker on a server's node leaves its gradient where the server reads it in "
                                     "place (an MPI-3 shared window) instead of sending it; not with SFB layers, "
                                     "OSDP on-demand layers, streamed rounds or gradients in device memory")


@dataclass
class TraceConfig:
    enabled: bool = _opt(True, "write DIR/trace/rank-NNNN.h5")
    flush_seconds: float = _opt(2.0, "flush trace files at least this often (seconds)", gt=0.0)


@dataclass
class CommConfig:
    hybrid: str = _opt("ps", "per dense layer, send the gradient through the server (ps), its sufficient factors "
                             "(sfb; Poseidon's HybComm), or whichever costs its busiest rank less (auto): bytes, "
                             "and for sfb also comm.sfb_overhead_bytes",
                       choices=("ps", "sfb", "auto"))
    sfb_overhead_bytes: float = _opt(float(SFB_OVERHEAD_BYTES),
                                     "auto: sfb's fixed cost per dense layer and iteration, in bytes-equivalent, "
                                     "added to its bytes (the default: measured across nodes at 1 Gbit/s, where "
                                     "sfb starts to pay between 192 and 256 wide at batch 32); 0: bytes alone, "
                                     "Poseidon's model", min=0.0)


@dataclass
class CheckpointConfig:
    every_seconds: float = _opt(0.0, "write DIR/checkpoint.h5 at least this often (seconds; 0: only at the end of "
                                     "the run and on SIGTERM); resume with train --resume DIR", min=0.0)


@dataclass
class OsdpConfig:
    plan: str = _opt("", "OSDP plan file (JSON) written by python -m ebsp_mpi plan: per layer resident, on-demand or "
                         "split; empty: every layer resident")
    memory_limit: str = _opt("", "memory one worker may hold, e.g. 512MiB or 2GB: a run whose plan (or all-resident "
                                 "model) needs more stops before training; empty: no limit")


@dataclass
class JobConfig:
    name: str = _opt("default", "run name (the default output directory is runs/<name>-<timestamp>)")
    seed: int = _opt(0, "seed of initialisation, data split, shuffling and stragglers", min=0)
    backend: str = _opt("auto", "array backend of the workers (EBSP_BACKEND overrides)",
                        choices=("auto", "numpy", "cupy"))
    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    sync: SyncConfig = field(default_factory=SyncConfig)
    stop: StopConfig = field(default_factory=StopConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    straggler: StragglerConfig = field(default_factory=StragglerConfig)
    runtime: RuntimeConfig = field(default_factory=RuntimeConfig)
    trace: TraceConfig = field(default_factory=TraceConfig)
    comm: CommConfig = field(default_factory=CommConfig)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    osdp: OsdpConfig = field(default_factory=OsdpConfig)


PHASE_KEYS = {"worker": int, "t1": float, "t2": float, "factor": float}


# -- loading ------------------------------------------------------------------------------------


def load_job(path: str | None = None, overrides: typing.Sequence[str] = ()) -> JobConfig:
    """Build a job from the embedded default, an optional TOML file and ``key=value`` overrides.

    Raises
    ------
    ConfigError
        On a missing or unparsable file, an unknown key, a wrong type or an out-of-range value.
    """
    job = JobConfig()
    if path is not None:
        apply_file(job, Path(path))
    return apply_overrides(job, overrides)


def apply_overrides(job: JobConfig, overrides: typing.Sequence[str]) -> JobConfig:
    """Set each ``key=value`` of `overrides` on `job`, in order, then check the keys that depend on each
    other; returns `job`."""
    for item in overrides:
        key, value = _split_override(item)
        set_value(job, key, value, source="--set")
    validate(job)
    return job


def job_from_dict(mapping: dict, source: str) -> JobConfig:
    """The job a resolved job's plain data (:func:`to_dict`, as stored in a run's outputs) describes."""
    job = JobConfig()
    apply_mapping(job, mapping, source)
    validate(job)
    return job


def apply_file(job: JobConfig, path: Path, seen: tuple = ()) -> None:
    """Apply a job file; its optional top-level ``base = "other.toml"`` (relative to the file) first.

    A job that differs from another in a few keys names it as its base and lists only those keys.
    """
    if path.resolve() in seen:
        chain = " -> ".join(str(p) for p in (*seen, path.resolve()))
        raise ConfigError(f"job file {path}: base files form a cycle: {chain}")
    mapping = read_toml(path)
    base = mapping.pop("base", None)
    if base is not None:
        if not isinstance(base, str):
            raise ConfigError(f"job file {path}: base = {base!r}: must be a string, the path of a job file")
        apply_file(job, path.parent / base, (*seen, path.resolve()))
    apply_mapping(job, mapping, source=str(path))


def read_toml(path: str | Path) -> dict:
    """Parse a TOML file (a job, a sweep, a base job).

    Raises
    ------
    ConfigError
        One line naming the path when the file is missing, unreadable, not UTF-8 text (TOML is UTF-8
        by definition; tomllib would raise a bare UnicodeDecodeError) or not valid TOML.
    """
    p = Path(path)
    if not p.is_file():
        raise ConfigError(f"job file {p}: not found")
    try:
        with p.open("rb") as f:
            return tomllib.load(f)
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"job file {p}: not valid TOML: {e}") from None
    except UnicodeDecodeError as e:
        raise ConfigError(f"job file {p}: not UTF-8 text (byte 0x{e.object[e.start]:02x} at offset {e.start}): "
                          "TOML files are UTF-8; save it as UTF-8 text") from None
    except OSError as e:
        raise ConfigError(f"job file {p}: cannot be read ({e.strerror or e})") from None


def apply_mapping(obj, mapping: dict, source: str, prefix: str = "") -> None:
    """Copy a parsed TOML table onto a config dataclass, key by key, with checks."""
    known = {f.name: f for f in dataclasses.fields(obj)}
    for key, value in mapping.items():
        dotted = f"{prefix}{key}"
        if key not in known:
            raise ConfigError(f"{source}: unknown key '{dotted}'{_suggest(key, known, prefix)}")
        current = getattr(obj, key)
        if dataclasses.is_dataclass(current):
            if not isinstance(value, dict):
                raise ConfigError(f"{source}: '{dotted}' must be a table [{dotted}], got {value!r}")
            apply_mapping(current, value, source, prefix=f"{dotted}.")
        else:
            setattr(obj, key, _coerce(known[key], _hint(obj, key), value, dotted, source))


def set_value(job: JobConfig, dotted: str, raw: str, source: str = "--set") -> None:
    """Set one dotted key from the command line; the text is read as a TOML value where it parses."""
    obj, parts = job, dotted.split(".")
    for depth, part in enumerate(parts):
        known = {f.name: f for f in dataclasses.fields(obj)}
        prefix = ".".join(parts[:depth])
        prefix = f"{prefix}." if prefix else ""
        if part not in known:
            raise ConfigError(f"{source}: unknown key '{dotted}'{_suggest(part, known, prefix)}")
        current = getattr(obj, part)
        last = depth == len(parts) - 1
        if dataclasses.is_dataclass(current):
            if last:
                raise ConfigError(f"{source}: '{dotted}' is a section; set one of its keys, e.g. "
                                  f"{dotted}.{dataclasses.fields(current)[0].name}=...")
            obj = current
            continue
        if not last:
            raise ConfigError(f"{source}: '{'.'.join(parts[:depth + 1])}' is a value, not a section")
        hint = _hint(obj, part)
        setattr(obj, part, _coerce(known[part], hint, _parse_cli_value(raw, hint), dotted, source))


def _split_override(item: str) -> tuple[str, str]:
    key, sep, value = item.partition("=")
    if not sep or not key.strip():
        raise ConfigError(f"--set {item!r}: expected key=value, e.g. --set optim.lr=0.1")
    return key.strip(), value.strip()


def _parse_cli_value(raw: str, hint):
    """Read a command-line value as TOML (numbers, booleans, lists); strings may go unquoted."""
    if hint is str or (hint == float | str and raw.strip("\"'").isalpha()):
        return raw[1:-1] if len(raw) >= 2 and raw[0] == raw[-1] and raw[0] in "\"'" else raw
    try:
        return tomllib.loads(f"v = {raw}")["v"]
    except tomllib.TOMLDecodeError:
        return raw  # _coerce reports it as the wrong type, naming the key


# -- type and range checks ---------------------------------------------------------------------


def _hint(obj, name: str):
    """The declared type of field ``name`` of a config dataclass (annotations are strings here)."""
    return typing.get_type_hints(type(obj))[name]


_TYPE_WORDS = {int: "an integer", float: "a number", bool: "true or false", str: "a string",
               dict: "a table", list: "a list"}


def _coerce(f: dataclasses.Field, hint, value, key: str, source: str):
    words = f.metadata.get("words")
    if words:  # a number or true/false, or one of a few words in its place (sync.zipline_z = "auto")
        hint = next(a for a in typing.get_args(hint) if a is not str)
        if isinstance(value, str):
            if value not in words:
                raise ConfigError(f"{source}: {key} = {value!r}: must be {_TYPE_WORDS[hint]} or one of "
                                  f"{', '.join(repr(w) for w in words)}")
            return value
    if typing.get_origin(hint) is list:
        (item,) = typing.get_args(hint)
        if not isinstance(value, list):
            raise ConfigError(f"{source}: {key} = {value!r}: must be a list (of {_TYPE_WORDS[item]} each), "
                              f"e.g. {_EXAMPLES[item]}")
        out = [_coerce_scalar(item, v, f"{key}[{i}]", source) for i, v in enumerate(value)]
        for i, v in enumerate(out):
            _check_range(f, v, f"{key}[{i}]", source)
        if f.metadata.get("nonempty") and not out:
            raise ConfigError(f"{source}: {key} = []: must not be empty")
        return out
    value = _coerce_scalar(hint, value, key, source)
    _check_range(f, value, key, source)
    return value


def _coerce_scalar(kind, value, key: str, source: str, open_ended: bool = False):
    """``value`` checked against the type ``kind`` (an int is accepted as a float).

    A float must be finite: TOML spells ``nan`` and ``inf``, and a NaN passes every range check
    (``nan < 0`` is false) and later disables a limit or poisons a rank. Only with ``open_ended``
    (a slow phase's end) is ``+inf`` allowed.
    """
    ok = {
        bool: isinstance(value, bool),
        int: isinstance(value, int) and not isinstance(value, bool),
        float: isinstance(value, (int, float)) and not isinstance(value, bool),
        str: isinstance(value, str),
        dict: isinstance(value, dict),
    }[kind]
    if not ok:
        raise ConfigError(f"{source}: {key} = {value!r}: must be {_TYPE_WORDS[kind]}")
    if kind is not float:
        return value
    try:
        value = float(value)
    except OverflowError:  # a TOML integer beyond the range of a float
        raise ConfigError(f"{source}: {key} = {value!r}: must be a finite number") from None
    if not math.isfinite(value) and not (open_ended and value == math.inf):
        allowed = "a finite number or inf (no end)" if open_ended else "a finite number"
        raise ConfigError(f"{source}: {key} = {value!r}: must be {allowed}")
    return value


def _check_range(f: dataclasses.Field, value, key: str, source: str) -> None:
    m = f.metadata
    if "choices" in m and value not in m["choices"]:
        raise ConfigError(f"{source}: {key} = {value!r}: must be one of {', '.join(m['choices'])}")
    if "min" in m and value < m["min"]:
        raise ConfigError(f"{source}: {key} = {value!r}: must be >= {m['min']}")
    if "gt" in m and value <= m["gt"]:
        raise ConfigError(f"{source}: {key} = {value!r}: must be > {m['gt']}")
    if "max" in m and value > m["max"]:
        raise ConfigError(f"{source}: {key} = {value!r}: must be <= {m['max']}")


_EXAMPLES = {int: "[64, 32]", float: "[1.0, 3.0]", dict: "[{worker = 1, t1 = 5.0, t2 = 10.0, factor = 3.0}]"}


def _suggest(key: str, known: dict, prefix: str) -> str:
    close = difflib.get_close_matches(key, list(known), n=1)
    hint = f"; did you mean '{prefix}{close[0]}'?" if close else ""
    where = f"[{prefix[:-1]}]" if prefix else "the top level"
    return f"{hint} (known keys in {where}: {', '.join(known)})"


# -- checks across keys ------------------------------------------------------------------------


def validate(job: JobConfig) -> None:
    """Checks that involve more than one key (single values were checked when set)."""
    if job.data.name in ("mnist", "fashion-mnist", "cifar10") and not job.data.root:
        raise ConfigError(f"data.root = '': data.name = {job.data.name!r} needs data.root, the directory "
                          f"with its files (nothing is downloaded)")
    if job.data.name == "mnist1d" and job.data.samples % 10:
        raise ConfigError(f"data.samples = {job.data.samples}: must be a multiple of 10 (MNIST-1D generates "
                          f"samples // 10 of each digit)")
    if job.data.name == "hdf5" and not job.data.path:
        raise ConfigError("data.path = '': data.name = 'hdf5' needs data.path, an HDF5 file with datasets x and y")
    if not (job.stop.iterations or job.stop.epochs or job.stop.seconds):
        raise ConfigError("stop: iterations, epochs and seconds are all 0; set at least one, "
                          "e.g. --set stop.iterations=200")
    if job.optim.schedule == "cosine" and not (job.optim.total_steps or job.stop.iterations):
        raise ConfigError("optim.schedule = 'cosine' needs optim.total_steps or stop.iterations")
    if 0 < job.runtime.chunk_bytes < 1024:
        raise ConfigError(f"runtime.chunk_bytes = {job.runtime.chunk_bytes}: must be 0 (auto) or >= 1024")
    job.straggler.phases = [_check_phase(p, f"straggler.phases[{i}]")
                            for i, p in enumerate(job.straggler.phases)]


def _check_phase(phase: dict, key: str) -> dict:
    """One slow phase, its numbers typed (t1, t2, factor as floats) and its values checked by
    :class:`~ebsp_mpi.straggler.SlowPhase` (worker >= 0, t1 < t2, a finite factor > 0)."""
    if set(phase) != set(PHASE_KEYS):
        raise ConfigError(f"{key} = {phase!r}: needs exactly the keys {', '.join(PHASE_KEYS)}")
    # t2 = inf is an open-ended phase (the worker stays slow to the end); every other number is finite
    phase = {name: _coerce_scalar(kind, phase[name], f"{key}.{name}", "job", open_ended=name == "t2")
             for name, kind in PHASE_KEYS.items()}
    try:
        SlowPhase(**phase)
    except ValueError as e:
        raise ConfigError(f"{key} = {phase!r}: {e}") from None
    return phase


def check_workers(job: JobConfig, world_size: int) -> int:
    """The number of workers for this launch (see ``sync.workers``)."""
    if world_size == 1:
        return job.sync.workers or 1
    servers = job.runtime.servers
    workers = world_size - servers
    if workers < 1:
        raise ConfigError(f"runtime.servers = {servers}: this launch has {world_size} ranks, which leaves no worker; "
                          f"launch at least {servers + 1} ranks or lower runtime.servers")
    if job.sync.workers not in (0, workers):
        raise ConfigError(f"sync.workers = {job.sync.workers}: this launch has {workers} workers "
                          f"(world size {world_size} minus {servers} server{'s' if servers > 1 else ''}); "
                          f"use 0 or {workers}")
    try:  # the factors and phases against the workers, checked by the model that applies them
        straggler_model(job.straggler, workers, job.seed)
    except ValueError as e:
        raise ConfigError(f"{e} (this launch has {workers} workers)") from None
    return workers


# -- output ------------------------------------------------------------------------------------


def to_dict(job: JobConfig) -> dict:
    """The resolved job as plain data (for summary.json and the trace attributes)."""
    return dataclasses.asdict(job)


def to_toml(job: JobConfig) -> str:
    """The resolved job as a TOML document (``python -m ebsp_mpi config`` prints it)."""
    lines = []
    for f in dataclasses.fields(job):
        value = getattr(job, f.name)
        if not dataclasses.is_dataclass(value):
            lines.append(f"{f.name} = {_toml_value(value)}")
    for f in dataclasses.fields(job):
        section = getattr(job, f.name)
        if dataclasses.is_dataclass(section):
            lines.append(f"\n[{f.name}]")
            for g in dataclasses.fields(section):
                lines.append(f"{g.name} = {_toml_value(getattr(section, g.name))}"
                             f"  # {g.metadata.get('help', '')}")
    return "\n".join(lines) + "\n"


def _toml_value(v) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, str):
        return '"' + v.replace("\\", "\\\\").replace('"', '\\"') + '"'
    if isinstance(v, list):
        return "[" + ", ".join(_toml_value(x) for x in v) + "]"
    if isinstance(v, dict):
        return "{" + ", ".join(f"{k} = {_toml_value(x)}" for k, x in v.items()) + "}"
    return repr(v)
