"""Bad input gets one line and exit code 2 before any rank trains.

The cases of a hostile-user campaign: job and sweep files that are not UTF-8 text, NaN and Inf in
float keys, training data with NaN or Inf, and a model or dataset larger than the machine's memory;
each checked where it is caught, then end to end at world size 1 and under mpiexec.
"""

import dataclasses
import subprocess
import sys
import typing
import warnings

import h5py
import numpy
import pytest
from datafiles import write_h5
from mpirun import child_env, local, train

from ebsp_mpi import build
from ebsp_mpi.config import ConfigError, JobConfig, load_job
from ebsp_mpi.data import DatasetError, load_dataset
from ebsp_mpi.data import loader as data_loader
from ebsp_mpi.data import memory
from ebsp_mpi.data.finite import first_nonfinite
from ebsp_mpi.data.normalize import standardize
from ebsp_mpi.errors import UsageError
from ebsp_mpi.nn.model import build_model, model_specs
from ebsp_mpi.sweep.spec import SweepError, check_members, load_sweep

#: Bytes that are not UTF-8: a byte-order mark of UTF-16, Latin-1 text, the start of a PNG file.
NOT_UTF8 = {
    "utf16": b"\xff\xfen\x00a\x00m\x00e\x00",
    "latin1": b'name = "caf\xe9"\n',
    "png": b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR",
}


def one_line(message: str) -> str:
    assert "\n" not in message.strip(), message
    return message


# -- 1. job and sweep files that are not UTF-8 --------------------------------------------------


@pytest.mark.parametrize("content", NOT_UTF8.values(), ids=NOT_UTF8.keys())
def test_a_job_file_that_is_not_utf8_is_named(tmp_path, content):
    path = tmp_path / "bad.toml"
    path.write_bytes(content)
    with pytest.raises(ConfigError) as e:
        load_job(str(path))
    assert f"job file {path}: not UTF-8 text" in one_line(str(e.value))


def test_a_job_whose_base_is_not_utf8_names_the_base(tmp_path):
    (tmp_path / "base.toml").write_bytes(NOT_UTF8["png"])
    (tmp_path / "job.toml").write_text('base = "base.toml"\n')
    with pytest.raises(ConfigError, match=r"job file .*base\.toml: not UTF-8 text"):
        load_job(str(tmp_path / "job.toml"))


def test_a_sweep_file_that_is_not_utf8_is_named(tmp_path):
    path = tmp_path / "sweep.toml"
    path.write_bytes(b'[[member]]\nname = "a"\n' + NOT_UTF8["latin1"])
    with pytest.raises(SweepError) as e:
        load_sweep(path)
    assert f"sweep file {path}: not UTF-8 text" in one_line(str(e.value))


def test_a_sweep_whose_base_job_is_not_utf8_names_the_member_and_the_base(tmp_path):
    (tmp_path / "base.toml").write_bytes(NOT_UTF8["utf16"])
    path = tmp_path / "sweep.toml"
    path.write_text('base = "base.toml"\n[[member]]\nname = "a"\nset = ["optim.lr=0.1"]\n')
    with pytest.raises(SweepError) as e:
        check_members(load_sweep(path), 2)
    assert "member 'a'" in str(e.value) and "base.toml: not UTF-8 text" in one_line(str(e.value))


@pytest.mark.timeout(120)
@pytest.mark.parametrize("command", [["train"], ["config"], ["sweep", "-n", "2", "--dry-run"]])
def test_the_cli_prints_one_line_and_exits_2_for_a_binary_file(tmp_path, command):
    path = tmp_path / "bad.toml"
    path.write_bytes(NOT_UTF8["png"])
    p = subprocess.run([sys.executable, "-m", "ebsp_mpi", *command, str(path)], capture_output=True, text=True,
                       timeout=60, env=child_env(), cwd=tmp_path)
    assert p.returncode == 2, p.stderr
    assert p.stderr.splitlines() == [p.stderr.strip()], p.stderr
    assert p.stderr.startswith("ebsp_mpi: error: ") and f"{path}: not UTF-8 text" in p.stderr


# -- 2. NaN and Inf in float keys ---------------------------------------------------------------


def float_keys(obj, prefix: str = ""):
    """Every float key of the schema, walked from the dataclasses: ``(dotted key, holds a list)``."""
    hints = typing.get_type_hints(type(obj))
    for f in dataclasses.fields(obj):
        value, hint = getattr(obj, f.name), hints[f.name]
        if dataclasses.is_dataclass(value):
            yield from float_keys(value, f"{prefix}{f.name}.")
        elif hint is float or hint == list[float]:
            yield f"{prefix}{f.name}", hint is not float


FLOAT_KEYS = sorted(float_keys(JobConfig()))


def test_the_walk_finds_the_float_keys():
    keys = dict(FLOAT_KEYS)
    for key in ("optim.lr", "stop.seconds", "stop.epochs", "runtime.stall_timeout_s", "straggler.jitter_sigma",
                "straggler.base_s", "sync.penalty", "sync.ema_alpha", "eval.every_seconds", "eval.targets",
                "straggler.slowdown"):
        assert key in keys
    assert keys["eval.targets"] is True and keys["optim.lr"] is False


@pytest.mark.parametrize("value", ["nan", "inf", "+inf", "-inf"])
@pytest.mark.parametrize("key, is_list", FLOAT_KEYS, ids=[k for k, _ in FLOAT_KEYS])
def test_every_float_key_refuses_nan_and_inf(key, is_list, value):
    raw = f"[{value}]" if is_list else value
    with pytest.raises(ConfigError) as e:
        load_job(None, [f"{key}={raw}"])
    message = one_line(str(e.value))
    assert key in message and "must be a finite number" in message
    assert ("nan" if value == "nan" else "inf") in message


def test_nan_in_a_job_file_names_the_file_and_key(tmp_path):
    path = tmp_path / "job.toml"
    path.write_text("[stop]\nseconds = inf\n[optim]\nlr = nan\n")
    with pytest.raises(ConfigError, match=r"job\.toml: stop\.seconds = inf: must be a finite number"):
        load_job(str(path))


def test_an_integer_too_large_for_a_float_is_refused():
    with pytest.raises(ConfigError, match=r"optim\.lr = 1000+: must be a finite number"):
        load_job(None, ["optim.lr=1" + "0" * 400])


def phase(**values) -> str:
    fields = {"worker": 0, "t1": 1.0, "t2": 2.0, "factor": 3.0, **values}
    return "straggler.phases=[{" + ", ".join(f"{k} = {v}" for k, v in fields.items()) + "}]"


def test_an_open_ended_slow_phase_keeps_working():
    job = load_job(None, [phase(t2="inf")])
    assert job.straggler.phases == [{"worker": 0, "t1": 1.0, "t2": float("inf"), "factor": 3.0}]


@pytest.mark.parametrize("values, words", [
    ({"t2": "nan"}, ["phases[0].t2 = nan", "a finite number or inf"]),
    ({"t2": "-inf"}, ["phases[0].t2 = -inf", "a finite number or inf"]),
    ({"t1": "nan"}, ["phases[0].t1 = nan", "must be a finite number"]),
    ({"t1": "-inf"}, ["phases[0].t1 = -inf", "must be a finite number"]),
    ({"t1": "inf", "t2": "inf"}, ["phases[0].t1 = inf", "must be a finite number"]),
    ({"factor": "inf"}, ["phases[0].factor = inf", "must be a finite number"]),
    ({"factor": "nan"}, ["phases[0].factor = nan", "must be a finite number"]),
])
def test_a_slow_phase_refuses_other_non_finite_numbers(values, words):
    with pytest.raises(ConfigError) as e:
        load_job(None, [phase(**values)])
    for word in words:
        assert word in one_line(str(e.value))


def test_a_sweep_refuses_nan_in_a_member_and_an_infinite_timeout(tmp_path):
    path = tmp_path / "sweep.toml"
    path.write_text('[[member]]\nname = "a"\nset = {optim = {lr = nan}}\n')
    with pytest.raises(SweepError, match=r"member 'a': --set: optim\.lr = nan: must be a finite number"):
        check_members(load_sweep(path), 2)
    path.write_text('timeout_s = inf\n[[member]]\nname = "a"\n')
    with pytest.raises(SweepError, match="timeout_s = inf: must be a finite number"):
        load_sweep(path)


# -- 3. training data with NaN or Inf ----------------------------------------------------------


def vectors(n=40, d=5, classes=3, seed=0):
    rng = numpy.random.default_rng(seed)
    return rng.normal(0.0, 1.0, (n, d)), rng.integers(0, classes, n)


@pytest.mark.parametrize("key, index, value", [
    ("x", 17, numpy.nan),
    ("x", 0, numpy.inf),
    ("x", 39, -numpy.inf),
    ("x", 5, 1e39),  # a float64 beyond float32's range becomes inf when read
    ("x_test", 3, numpy.nan),
])
@pytest.mark.parametrize("normalize", [True, False])
def test_hdf5_inputs_with_nan_or_inf_name_the_path_and_the_sample(tmp_path, key, index, value, normalize):
    x, y = vectors()
    xt, yt = vectors(10, seed=1)
    bad = {"x": x, "x_test": xt}[key]
    bad[index, 2] = value
    path = write_h5(tmp_path / "d.h5", x=x, y=y, x_test=xt, y_test=yt)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no RuntimeWarning of NumPy's cast: the one line is all a user sees
        with pytest.raises(DatasetError) as e:
            load_dataset("hdf5", path=path, normalize=normalize)
    assert f"data.path = {path}: {key}[{index}] holds NaN or Inf" in one_line(str(e.value))


def test_without_a_test_split_the_index_is_the_files_not_the_splits(tmp_path):
    x, y = vectors(n=200)
    x[123, 0] = numpy.nan
    path = write_h5(tmp_path / "d.h5", x=x, y=y)
    with pytest.raises(DatasetError, match=r": x\[123\] holds NaN or Inf"):
        load_dataset("hdf5", path=path)


@pytest.mark.parametrize("name, reader, key", [
    ("digits", "load_digits", "x"),
    ("synthetic", "load_synthetic", "x"),
    ("mnist", "load_idx_dataset", "x_test"),
    ("cifar10", "load_cifar10", "x_train"),
])
def test_every_reader_passes_the_same_finite_check(monkeypatch, name, reader, key):
    """A reader that returned NaN (a corrupt file, a future loader) is caught in the common place."""
    x, y = vectors(n=30)
    x = x.astype(numpy.float32)
    x[7, 1] = numpy.nan
    clean = numpy.zeros_like(x)
    if reader in ("load_idx_dataset", "load_cifar10"):  # official splits: train and test
        splits = (x, y, clean, y) if key == "x_train" else (clean, y, x, y)
        monkeypatch.setattr(data_loader, reader, lambda *a, **k: (*splits, 3, (5,)))
    else:
        monkeypatch.setattr(data_loader, reader, lambda *a, **k: (x, y, 3, (5,)))
    with pytest.raises(DatasetError, match=rf"data.name = '{name}': {key}\[7\] holds NaN or Inf"):
        load_dataset(name, root="unused")


@pytest.mark.parametrize("rows, chunk_bytes", [(1, 1), (10, 1), (1000, 1), (1000, 64 << 20), (1000, 4000)])
def test_first_nonfinite_finds_the_first_bad_sample_in_any_chunking(rows, chunk_bytes):
    x = numpy.zeros((rows, 3, 4), dtype=numpy.float32)
    assert first_nonfinite(x, chunk_bytes) is None
    x[rows - 1, 2, 3] = numpy.inf
    assert first_nonfinite(x, chunk_bytes) == rows - 1
    x[rows // 2, 0, 0] = numpy.nan
    assert first_nonfinite(x, chunk_bytes) == rows // 2
    assert first_nonfinite(numpy.arange(12).reshape(3, 4)) is None  # integers are always finite


def test_a_constant_feature_standardises_to_zero_not_nan():
    x = numpy.ones((50, 4), dtype=numpy.float32)
    x[:, 1] = numpy.arange(50)
    xt = numpy.ones((5, 4), dtype=numpy.float32)
    _, std = standardize(x, xt)
    assert numpy.isfinite(x).all() and numpy.isfinite(xt).all()
    assert (x[:, 0] == 0).all() and std[0] == 1.0


def test_a_training_feature_too_wide_for_float32_is_named():
    x = numpy.zeros((50, 3), dtype=numpy.float32)
    x[10, 2] = 1e30  # its squared deviation overflows float32: std would be inf and the feature all 0
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(DatasetError, match=r"data\.path = d\.h5: feature 2 of the training inputs"):
            standardize(x, numpy.zeros((5, 3), dtype=numpy.float32), "data.path = d.h5")


def test_a_test_sample_far_outside_a_nearly_constant_feature_is_named(tmp_path):
    x, y = vectors()
    x[:, 1] = 1.0
    x[0, 1] = 1.0 + 1e-6  # a tiny but non-zero training spread
    xt, yt = vectors(10, seed=1)
    xt[4, 1] = 3e38
    path = write_h5(tmp_path / "d.h5", x=x, y=y, x_test=xt.astype(numpy.float32), y_test=yt)
    with pytest.raises(DatasetError, match="test sample 4 becomes NaN or Inf when standardised"):
        load_dataset("hdf5", path=path)
    assert numpy.isfinite(load_dataset("hdf5", path=path, normalize=False).x_test).all()


# -- 4. a model or a dataset that cannot fit in memory -----------------------------------------


@pytest.fixture
def small_machine(monkeypatch):
    """A machine of 64 MiB, so that modest sizes exercise the memory checks without allocating."""
    monkeypatch.setattr(memory, "physical_memory", lambda: 64 << 20)


def model_error(job, ds) -> str:
    with pytest.raises(build.ModelError) as e:
        build.model(job, ds)
    assert isinstance(e.value, UsageError)
    return one_line(str(e.value))


@pytest.mark.parametrize("kind, hidden, channels", [("mlp", [128], [8]), ("mlp", [7, 300, 2], [8]),
                                                    ("cnn", [32], [4, 6]), ("cnn", [], [3])])
def test_model_specs_count_what_build_model_allocates(kind, hidden, channels):
    specs = model_specs(kind, (1, 8, 8), 10, hidden=hidden, channels=channels)
    model = build_model(kind, (1, 8, 8), 10, hidden=hidden, channels=channels)
    assert [(s.name, s.shape) for s in specs] == [(s.name, s.shape) for s in model.space.specs]
    assert sum(s.size for s in specs) == model.space.size
    assert build.model_bytes(specs, numpy.dtype(numpy.float32)) == model.space.size * 20


def test_the_default_model_fits():
    job = load_job()
    assert build.model(job, build.dataset(job)).space.size > 0


def test_a_wide_hidden_layer_is_refused_naming_the_key(small_machine):
    job = load_job(None, ["model.hidden=[100000]"])
    message = model_error(job, build.dataset(job))
    assert "the model needs" in message and "more than this machine's 64.0 MiB of physical memory" in message
    assert "dense1.W (64 x 100000)" in message and "model.hidden = [100000]" in message


def test_a_wide_cnn_names_hidden_and_channels(small_machine):
    job = load_job(None, ["model.kind=cnn", "model.hidden=[1000000]"])
    message = model_error(job, build.dataset(job))
    assert "model.hidden = [1000000] and model.channels = [8, 16]" in message


def test_a_huge_label_is_refused_naming_the_label_and_the_file(tmp_path):
    """The real machine's memory: 10**9 + 1 classes need terabytes anywhere."""
    x, y = vectors()
    y[5] = 10**9
    path = write_h5(tmp_path / "d.h5", x=x, y=y)
    job = load_job(None, ["data.name=hdf5", f"data.path={path}"])
    message = model_error(job, build.dataset(job))
    assert "1000000001 classes" in message
    assert f"the largest label in data.path = {path} is 1000000000" in message


def test_a_huge_num_classes_attribute_is_named(tmp_path, small_machine):
    x, y = vectors()
    path = write_h5(tmp_path / "d.h5", attrs={"num_classes": 10**6}, x=x, y=y)
    job = load_job(None, ["data.name=hdf5", f"data.path={path}"])
    message = model_error(job, build.dataset(job))
    assert f"the root attribute num_classes = 1000000 of data.path = {path}" in message


def test_an_hdf5_dataset_larger_than_memory_is_refused_before_reading(tmp_path, small_machine):
    path = tmp_path / "d.h5"
    with h5py.File(path, "w") as f:  # 64 Mi float64 values, never written: the file stays small
        f.create_dataset("x", shape=(1 << 20, 64), dtype="f8")
        f["y"] = numpy.zeros(1 << 20, dtype=numpy.int64)
    with pytest.raises(DatasetError, match=r"dataset 'x' of shape \(1048576, 64\) and dtype float64 needs "
                                           r"768\.0 MiB to load as float32, more than this machine's 64\.0 MiB"):
        load_dataset("hdf5", path=str(path))


def test_a_synthetic_dataset_larger_than_memory_is_refused(small_machine):
    with pytest.raises(DatasetError, match=r"data\.synthetic_samples = 10000000, .* more than this machine's"):
        load_dataset("synthetic", synthetic_samples=10**7)


@pytest.mark.parametrize("label, words", [
    (-3, ["negative label -3"]),
    (numpy.iinfo(numpy.uint64).max, ["label 18446744073709551615"]),
])
def test_labels_that_cannot_be_right_are_refused_at_load(tmp_path, label, words):
    x, y = vectors()
    y = y.astype(numpy.int64 if label < 0 else numpy.uint64)
    y[3] = label
    path = write_h5(tmp_path / "d.h5", x=x, y=y)
    with pytest.raises(DatasetError) as e:
        load_dataset("hdf5", path=path)
    for word in words:
        assert word in one_line(str(e.value))


def test_a_model_that_does_not_suit_the_data_is_one_line(tmp_path):
    job = load_job(None, ["model.kind=cnn", "data.name=synthetic", "data.synthetic_samples=100"])
    assert "model.kind = 'cnn' needs images" in model_error(job, build.dataset(job))
    x, _ = vectors()
    path = write_h5(tmp_path / "d.h5", x=x, y=numpy.zeros(len(x), dtype=numpy.int64))
    job = load_job(None, ["data.name=hdf5", f"data.path={path}"])
    assert "1 class (the largest label in" in model_error(job, build.dataset(job))


# -- 5. end to end: one line and exit code 2 at world size 1 and under MPI ---------------------


@pytest.fixture
def bad_files(tmp_path):
    x, y = vectors()
    nan = x.copy()
    nan[17, 0] = numpy.nan
    big = y.copy()
    big[5] = 10**9
    bad = tmp_path / "bad.toml"
    bad.write_bytes(NOT_UTF8["png"])
    return {"nan": write_h5(tmp_path / "nan.h5", x=nan, y=y), "big": write_h5(tmp_path / "big.h5", x=x, y=big),
            "bad": str(bad)}


CASES = {
    "not-utf8": ({"job": "bad"}, [], "bad.toml: not UTF-8 text"),
    "nan-key": ({}, ["runtime.stall_timeout_s=nan"], "runtime.stall_timeout_s = nan: must be a finite number"),
    "nan-data": ({}, ["data.name=hdf5", "data.path={nan}"], "nan.h5: x[17] holds NaN or Inf"),
    "huge-label": ({}, ["data.name=hdf5", "data.path={big}"], "the largest label in data.path = "),
    "huge-hidden": ({}, ["model.hidden=[10000000000]"], "model.hidden = [10000000000]"),
}


def expand(case: str, files: dict):
    where, overrides, words = CASES[case]
    job = files[where["job"]] if "job" in where else None
    return job, [o.format(**files) for o in overrides], words


@pytest.mark.timeout(300)
@pytest.mark.parametrize("case", CASES)
def test_world_size_1_prints_one_line_and_exits_2(tmp_path, bad_files, case):
    job, overrides, words = expand(case, bad_files)
    p = local(tmp_path / "run", *overrides, job=job, timeout=120)
    assert p.returncode == 2, p.stderr
    assert p.stderr.splitlines() == [p.stderr.strip()], p.stderr
    assert p.stderr.startswith("ebsp_mpi: error: ") and words in p.stderr


@pytest.mark.slow
@pytest.mark.timeout(600)
@pytest.mark.parametrize("case", ["not-utf8", "nan-data", "huge-label"])
def test_under_mpi_rank_0_prints_one_line_and_every_rank_exits_2(tmp_path, bad_files, case):
    job, overrides, words = expand(case, bad_files)
    p = train(3, tmp_path / "run", *overrides, job=job, timeout=180)
    assert p.returncode == 2, p.stderr
    lines = [line for line in p.stderr.splitlines() if line.startswith("ebsp_mpi: error")]
    assert len(lines) == 1 and words in lines[0], p.stderr
    assert "Traceback" not in p.stderr
