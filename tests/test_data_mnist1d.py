"""data.name = 'mnist1d': the one-line refusal without the extra, and, with it, the locally generated
set (the package's generator on its default arguments), its cache, and a run of train and simulate."""

import json
import os
import re
import sys
from pathlib import Path

import numpy
import pytest

from cliutil import one_line_error
from ebsp_mpi.cli import main
from ebsp_mpi.config import ConfigError, load_job
from ebsp_mpi.data import DatasetError, load_dataset
from ebsp_mpi.data import mnist1d as m1d

SAMPLES = 200  # 160 train, 40 test: a fraction of a second to generate
JOBS = Path(__file__).parents[1] / "jobs"


@pytest.fixture
def without_extra(monkeypatch):
    """The mnist1d package hidden, as where the extra is not installed (a None entry fails the import)."""
    for name in ("mnist1d", "mnist1d.data"):
        monkeypatch.setitem(sys.modules, name, None)


def test_missing_extra_is_one_line_saying_how_to_install(without_extra, tmp_path):
    with pytest.raises(DatasetError) as raised:
        load_dataset("mnist1d", root=str(tmp_path), samples=SAMPLES)
    message = str(raised.value)
    assert "\n" not in message and "pip install 'ebsp-mpi[mnist1d]'" in message
    assert os.listdir(tmp_path) == []


def test_missing_extra_from_the_command_line(without_extra, tmp_path, capsys):
    line = one_line_error(capsys, ["train", "--set", "data.name=mnist1d", "--set", f"data.root={tmp_path}",
                                   "--out", str(tmp_path / "run")])
    assert "needs the package mnist1d" in line and "pip install" in line


def test_samples_must_be_a_multiple_of_ten(tmp_path):
    with pytest.raises(ConfigError, match=r"data\.samples = 205: must be a multiple of 10"):
        load_job(None, ["data.name=mnist1d", "data.samples=205"])
    load_job(None, ["data.name=digits", "data.samples=205"])  # only mnist1d reads it
    with pytest.raises(DatasetError, match=r"data\.samples = 15; expected a multiple of 10"):
        load_dataset("mnist1d", root=str(tmp_path), samples=15)


# -- with the extra --------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def package():
    return pytest.importorskip("mnist1d.data")


def test_generated_set_is_the_packages_own_with_its_published_split(package, tmp_path):
    state = numpy.random.get_state()
    ds = load_dataset("mnist1d", root=str(tmp_path), samples=SAMPLES, normalize=False)
    # make_dataset reseeds NumPy's global generator; the loader gives the caller's state back
    numpy.testing.assert_array_equal(numpy.random.get_state()[1], state[1])
    args = package.get_dataset_args()
    args.num_samples = SAMPLES  # the only argument changed
    made = package.make_dataset(args)
    assert (ds.num_train, ds.num_test, ds.num_classes, ds.input_shape) == (160, 40, 10, (1, 1, 40))
    numpy.testing.assert_array_equal(ds.x_train[:, 0, 0], made["x"].astype(numpy.float32))
    numpy.testing.assert_array_equal(ds.x_test[:, 0, 0], made["x_test"].astype(numpy.float32))
    numpy.testing.assert_array_equal(ds.y_train, made["y"])
    numpy.testing.assert_array_equal(ds.y_test, made["y_test"])
    assert ds.x_train.dtype == numpy.float32 and ds.y_train.dtype == numpy.int64


def test_cached_by_its_parameters_and_read_back_without_generating(package, tmp_path, monkeypatch):
    first = load_dataset("mnist1d", root=str(tmp_path), samples=SAMPLES)
    (cached,) = [f for f in os.listdir(tmp_path) if f.endswith(".h5")]
    assert cached.startswith(f"mnist1d-{SAMPLES}-")
    mask = os.umask(0o022)
    os.umask(mask)
    assert os.stat(tmp_path / cached).st_mode & 0o777 == 0o666 & ~mask  # readable by others as umask allows

    def no_generation(args):
        raise AssertionError("generated again although the cache holds the set")

    monkeypatch.setattr(m1d, "generate", no_generation)
    again = load_dataset("mnist1d", root=str(tmp_path), samples=SAMPLES, seed=5)  # the job seed plays no part
    numpy.testing.assert_array_equal(again.x_train, first.x_train)
    numpy.testing.assert_array_equal(again.y_test, first.y_test)
    with pytest.raises(AssertionError, match="generated again"):  # another size is another file
        load_dataset("mnist1d", root=str(tmp_path), samples=SAMPLES + 10)


def test_cache_goes_to_the_user_cache_directory_by_default(package, tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    load_dataset("mnist1d", samples=SAMPLES)
    assert any(f.endswith(".h5") for f in os.listdir(tmp_path / "ebsp-mpi"))


def test_a_damaged_cache_file_is_named(package, tmp_path):
    load_dataset("mnist1d", root=str(tmp_path), samples=SAMPLES)
    (cached,) = [f for f in os.listdir(tmp_path) if f.endswith(".h5")]
    (tmp_path / cached).write_bytes(b"not a zip")
    with pytest.raises(DatasetError, match=re.escape(cached) + ": not a readable MNIST-1D cache file.*delete it"):
        load_dataset("mnist1d", root=str(tmp_path), samples=SAMPLES)


def test_read_like_any_dataset_normalised_and_sharded(package, tmp_path):
    from ebsp_mpi.data import shard_indices

    ds = load_dataset("mnist1d", root=str(tmp_path), samples=SAMPLES, max_train=100)
    assert ds.num_train == 100
    assert abs(float(ds.x_train.mean())) < 1e-5 and float(ds.x_train.std()) == pytest.approx(1.0, abs=1e-4)
    shards = [shard_indices(ds.num_train, 4, k) for k in range(4)]
    assert sorted(numpy.concatenate(shards).tolist()) == list(range(100))


def test_train_and_simulate_train_run_the_mnist1d_cnn(package, tmp_path, capsys):
    common = ["--set", f"data.root={tmp_path}", "--set", f"data.samples={SAMPLES}", "--set", "stop.iterations=20"]
    assert main(["train", str(JOBS / "mnist1d-cnn.toml"), *common, "--out", str(tmp_path / "train")]) == 0
    summary = json.loads((tmp_path / "train" / "summary.json").read_text())
    assert summary["config"]["model"]["kind"] == "cnn1d" and summary["test_accuracy"] is not None
    assert main(["simulate", "--train", "--workers", "4", str(JOBS / "mnist1d-mlp.toml"), *common, "--set",
                 "sync.model=asp", "--set", "data.batch_size=10", "--out", str(tmp_path / "sim")]) == 0


def test_the_cache_file_is_the_sets_hdf5_export(package, tmp_path):
    generated = load_dataset("mnist1d", root=str(tmp_path), samples=SAMPLES)
    (cached,) = [f for f in os.listdir(tmp_path) if f.endswith(".h5")]
    exported = load_dataset("hdf5", path=str(tmp_path / cached))
    assert exported.input_shape == generated.input_shape == (1, 1, 40) and exported.num_classes == 10
    for key in ("x_train", "y_train", "x_test", "y_test", "mean", "std"):
        numpy.testing.assert_array_equal(getattr(exported, key), getattr(generated, key))


def test_the_run_identity_names_the_generated_set(package):
    # a run made from one generated set must not resume or replay on another: the identity's data
    # piece is the cache name, which hashes the generator's arguments and version
    from ebsp_mpi.identity import data_fingerprint

    small = data_fingerprint({"data": {"name": "mnist1d", "samples": 5000}})
    large = data_fingerprint({"data": {"name": "mnist1d", "samples": 8000}})
    assert small and large and small != large
    assert small == data_fingerprint({"data": {"name": "mnist1d", "samples": 5000}})
    assert next(iter(small)).startswith("mnist1d-5000-")


def test_the_run_identity_without_the_extra_says_so(without_extra):
    from ebsp_mpi.identity import data_fingerprint

    assert data_fingerprint({"data": {"name": "mnist1d", "samples": 5000}}) == {
        "mnist1d": "generator not installed"}
