"""The job schema: defaults, TOML files, --set overrides and the one-line errors."""

import dataclasses
import re

import pytest

from ebsp_mpi.config import (ConfigError, DataConfig, JobConfig, ModelConfig, OptimConfig, SyncConfig, check_workers,
                             load_job, to_toml)


def write(tmp_path, text):
    path = tmp_path / "job.toml"
    path.write_text(text)
    return str(path)


def test_embedded_default_is_the_digits_mlp():
    job = load_job()
    assert (job.data.name, job.model.kind, job.sync.model) == ("digits", "mlp", "bsp")
    assert job.stop.epochs > 0


def test_file_then_overrides_in_order(tmp_path):
    path = write(tmp_path, 'name = "x"\n[optim]\nlr = 0.2\nmomentum = 0.5\n[model]\nhidden = [32, 16]\n')
    job = load_job(path, ["optim.lr=0.3", "sync.model=ssp", "sync.staleness=0", "straggler.enabled=false"])
    assert job.name == "x"
    assert job.optim.lr == 0.3 and job.optim.momentum == 0.5
    assert job.model.hidden == [32, 16]
    assert job.sync.model == "ssp" and job.sync.staleness == 0
    assert job.straggler.enabled is False


def test_integers_are_accepted_where_numbers_are_expected():
    job = load_job(None, ["optim.lr=1", "straggler.slowdown=[1, 3]"])
    assert job.optim.lr == 1.0 and isinstance(job.optim.lr, float)
    assert job.straggler.slowdown == [1.0, 3.0]


def test_quoted_and_unquoted_strings():
    assert load_job(None, ["sync.model=asp"]).sync.model == "asp"
    assert load_job(None, ['sync.model="asp"']).sync.model == "asp"


@pytest.mark.parametrize("override, words", [
    ("optim.lr=-1", ["optim.lr", "-1", "> 0"]),
    ("optim.lrr=0.1", ["optim.lrr", "did you mean 'optim.lr'"]),
    ("nosuch.key=1", ["nosuch.key"]),
    ("sync.model=bogus", ["sync.model", "bogus", "bsp", "elasticbsp"]),
    ("data.batch_size=1.5", ["data.batch_size", "integer"]),
    ("data.batch_size=0", ["data.batch_size", ">= 1"]),
    ("stop.epochs=abc", ["stop.epochs", "number"]),
    ("model.hidden=3", ["model.hidden", "list"]),
    ("model.hidden=[]", ["model.hidden", "empty"]),
    ("straggler.enabled=1", ["straggler.enabled", "true or false"]),
    ("optim=1", ["optim", "section"]),
    ("optim.lr.x=1", ["optim.lr", "not a section"]),
    ("optim.lr", ["key=value"]),
    ("straggler.phases=[{worker = 0}]", ["straggler.phases[0]", "t1"]),
    ("straggler.phases=[{worker = 0, t1 = 5.0, t2 = 1.0, factor = 2.0}]", ["t1 < t2"]),
])
def test_bad_overrides_name_key_value_and_what_is_allowed(override, words):
    with pytest.raises(ConfigError) as e:
        load_job(None, [override])
    message = str(e.value)
    assert "\n" not in message
    for word in words:
        assert word in message


def test_misspelt_key_in_file_names_the_file_and_key(tmp_path):
    path = write(tmp_path, "[optim]\nmomentun = 0.5\n")
    with pytest.raises(ConfigError, match=r"job.toml: unknown key 'optim.momentun'; did you mean 'optim.momentum'"):
        load_job(path)


def test_unknown_section_and_bad_toml(tmp_path):
    with pytest.raises(ConfigError, match="unknown key 'optimizer'"):
        load_job(write(tmp_path, "[optimizer]\nlr = 1.0\n"))
    with pytest.raises(ConfigError, match="not valid TOML"):
        load_job(write(tmp_path, "[optim\nlr = 1.0\n"))
    with pytest.raises(ConfigError, match="not found"):
        load_job(str(tmp_path / "missing.toml"))


def test_cross_key_checks():
    with pytest.raises(ConfigError, match=re.escape("data.root")):
        load_job(None, ["data.name=mnist"])
    with pytest.raises(ConfigError, match=re.escape("data.path")):
        load_job(None, ["data.name=hdf5"])
    with pytest.raises(ConfigError, match="set at least one"):
        load_job(None, ["stop.epochs=0"])
    with pytest.raises(ConfigError, match="cosine"):
        load_job(None, ["optim.schedule=cosine"])
    with pytest.raises(ConfigError, match=r"chunk_bytes = 100: must be 0 \(auto\) or >= 1024"):
        load_job(None, ["runtime.chunk_bytes=100"])
    assert load_job(None, ["runtime.chunk_bytes=0"]).runtime.chunk_bytes == 0


def test_phases_are_typed():
    job = load_job(None, ["straggler.phases=[{worker = 1, t1 = 2, t2 = 4, factor = 3}]"])
    assert job.straggler.phases == [{"worker": 1, "t1": 2.0, "t2": 4.0, "factor": 3.0}]


def test_check_workers_against_world_size():
    job = JobConfig()
    assert check_workers(job, 1) == 1
    assert check_workers(job, 5) == 4
    job.sync.workers = 3
    assert check_workers(job, 1) == 3
    with pytest.raises(ConfigError, match="this launch has 4 workers"):
        check_workers(job, 5)
    job = load_job(None, ["straggler.slowdown=[1, 1, 3]"])
    with pytest.raises(ConfigError, match=re.escape("straggler.slowdown")):
        check_workers(job, 3)


def test_to_toml_round_trips(tmp_path):
    job = load_job(None, ["optim.lr=0.3", "model.hidden=[7]", "straggler.phases=[{worker=0,t1=1,t2=2,factor=3}]",
                          "data.root=C:\\\\x \"y\""])
    again = load_job(write(tmp_path, to_toml(job)))
    assert again == job


def test_a_job_file_can_name_a_base_job(tmp_path):
    (tmp_path / "base.toml").write_text('name = "b"\n[optim]\nlr = 0.2\nmomentum = 0.5\n')
    (tmp_path / "sub").mkdir()
    child = tmp_path / "sub" / "child.toml"
    child.write_text('base = "../base.toml"\n[optim]\nmomentum = 0.0\n')
    job = load_job(str(child))
    assert (job.name, job.optim.lr, job.optim.momentum) == ("b", 0.2, 0.0)


def test_base_cycles_and_bad_base_are_errors(tmp_path):
    (tmp_path / "a.toml").write_text('base = "b.toml"\n')
    (tmp_path / "b.toml").write_text('base = "a.toml"\n')
    with pytest.raises(ConfigError, match="cycle"):
        load_job(str(tmp_path / "a.toml"))
    (tmp_path / "c.toml").write_text("base = 3\n")
    with pytest.raises(ConfigError, match="base = 3"):
        load_job(str(tmp_path / "c.toml"))
    (tmp_path / "d.toml").write_text('base = "missing.toml"\n')
    with pytest.raises(ConfigError, match=re.escape("missing.toml: not found")):
        load_job(str(tmp_path / "d.toml"))


def _choices(section, key: str) -> tuple:
    """The values config.py allows for `key` of a config dataclass."""
    return next(f for f in dataclasses.fields(section) if f.name == key).metadata["choices"]


def test_allowed_values_are_those_of_the_registries_they_name():
    """config.py imports only the standard library, so it names the allowed values itself; they must be
    exactly what the code that acts on them accepts, in the same order."""
    from ebsp_mpi.backend import BACKENDS
    from ebsp_mpi.data import DATASETS
    from ebsp_mpi.nn import KINDS, SCHEDULES
    from ebsp_mpi.sync.predictor import RULES
    from ebsp_mpi.sync.registry import POLICIES

    assert _choices(SyncConfig, "model") == POLICIES
    assert _choices(SyncConfig, "predictor") == RULES
    assert _choices(DataConfig, "name") == DATASETS
    assert _choices(OptimConfig, "schedule") == SCHEDULES
    assert _choices(ModelConfig, "kind") == KINDS
    assert _choices(JobConfig, "backend") == BACKENDS


def test_overdue_is_none_or_widen():
    assert load_job(None).sync.overdue == "none"
    assert load_job(None, ["sync.overdue=widen"]).sync.overdue == "widen"
    with pytest.raises(ConfigError, match=r"sync\.overdue"):
        load_job(None, ["sync.overdue=shift"])


def test_zipline_z_is_a_number_or_auto(tmp_path):
    assert load_job(None, ["sync.zipline_z=1.5"]).sync.zipline_z == 1.5
    assert load_job(None, ["sync.zipline_z=2"]).sync.zipline_z == 2.0
    assert load_job(None, ["sync.zipline_z=auto"]).sync.zipline_z == "auto"
    assert load_job(None, ['sync.zipline_z="auto"']).sync.zipline_z == "auto"
    assert load_job(None).sync.zipline_z == 0.0
    for value, words in (("-0.5", "must be >= 0.0"), ("often", "must be a number or one of 'auto'"),
                         ("nan", "must be a number"), ("[1]", "must be a number")):
        with pytest.raises(ConfigError, match=f"sync.zipline_z = .*{words}"):
            load_job(None, [f"sync.zipline_z={value}"])
    job = tmp_path / "job.toml"
    job.write_text('[sync]\nzipline_z = "auto"\n')
    assert load_job(str(job)).sync.zipline_z == "auto"
    job.write_text("[sync]\nzipline_z = inf\n")
    with pytest.raises(ConfigError, match=r"job\.toml: sync\.zipline_z = inf: must be a finite number"):
        load_job(str(job))
    # the resolved job prints and reads back
    again = tmp_path / "again.toml"
    again.write_text(to_toml(load_job(None, ["sync.zipline_z=auto"])))
    assert load_job(str(again)).sync.zipline_z == "auto"
