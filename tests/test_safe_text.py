"""Text from outside (an MPI library's version, host names, paths, job text) reaches HDF5 and JSON
through one rule, ``ebsp_mpi.safe_text``: a NUL, bytes that are not UTF-8 and a huge value are stored,
readable, instead of failing the run (Open MPI's version string ends with a NUL byte, which HDF5
refused: every job under Open MPI crashed on rank 0)."""

import json
import os

import h5py
import pytest

from ebsp_mpi.outputs import read_model, write_model, write_summary
from ebsp_mpi.runtime.transport.env import local_ranks, rank_from_env, world_size_from_env
from ebsp_mpi.safe_text import LABEL_CHARS, MAX_CHARS, ascii_digits, clean_text, clean_tree, path_label
from ebsp_mpi.trace import read_run
from ebsp_mpi.trace.writer import TraceWriter

OPEN_MPI_VERSION = "Open MPI v5.0.11, package: Open MPI user@localhost Distribution, ident: 5.0.11\0"
NOT_UTF8 = os.fsdecode(b"/scratch/r\xe9sultats")  # a Latin-1 file name, as Python decodes it
HUGE = "x" * 200_000


def test_a_trailing_nul_is_dropped_and_an_inner_one_shown():
    assert clean_text(OPEN_MPI_VERSION) == OPEN_MPI_VERSION[:-1]
    assert clean_text("a\0b\0\0") == "a\\x00b"
    assert clean_text(b"node7\0") == "node7"


def test_bytes_that_are_not_utf8_are_shown_as_escapes():
    assert clean_text(NOT_UTF8) == "/scratch/r\\xe9sultats"
    assert clean_text(b"r\xe9sultats") == "r\\xe9sultats"
    assert clean_text(os.fsdecode("résultats".encode())) == "résultats"  # UTF-8 stays as it is
    assert clean_text("\ud800") == "\\xed\\xa0\\x80"  # a lone surrogate no decoding made


def test_a_huge_value_is_cut_and_says_how_much_was_left_out():
    text = clean_text(HUGE)
    assert text.startswith("x" * MAX_CHARS) and text.endswith(f"... [{len(HUGE) - MAX_CHARS} more characters]")
    assert clean_text("short") == "short"


def test_clean_tree_walks_keys_lists_and_paths():
    from pathlib import Path
    got = clean_tree({"host\0": ["a\0", (b"b\xff", 3)], "n": 1.5, "p": Path("/tmp") / "x"})
    assert got == {"host": ["a", ["b\\xff", 3]], "n": 1.5, "p": "/tmp/x"}


def test_a_trace_stores_every_kind_of_outside_text(tmp_path):
    """What crashed every job under Open MPI: its version string as a trace attribute."""
    attrs = dict(run_id=NOT_UTF8.rsplit("/", 1)[1], rank=0, role="server", host="node\0", mpi_library=OPEN_MPI_VERSION,
                 device=HUGE, config={"name": "job\0", "data": {"path": NOT_UTF8}})
    with TraceWriter(tmp_path / "trace" / "rank-0000.h5", attrs) as trace:
        trace.set_attrs(note=b"\xff\0")
    with h5py.File(tmp_path / "trace" / "rank-0000.h5", "r") as f:
        assert f.attrs["mpi_library"] == OPEN_MPI_VERSION[:-1]
        assert f.attrs["host"] == "node" and f.attrs["run_id"] == "r\\xe9sultats" and f.attrs["note"] == "\\xff"
        assert len(f.attrs["device"]) < 9000
    got = read_run(tmp_path)[0].attrs
    assert got["config"] == {"name": "job", "data": {"path": "/scratch/r\\xe9sultats"}}


def test_summary_and_model_store_outside_text_as_strict_json_and_hdf5(tmp_path):
    summary = {"name": "job\0", "mpi_library": OPEN_MPI_VERSION, "config": {"data": {"path": NOT_UTF8}},
               "note": HUGE}
    path = write_summary(tmp_path, summary)
    text = path.read_text(encoding="utf-8")
    assert "\\u0000" not in text and "\\ud" not in text  # no NUL, no lone surrogate escaped into the JSON
    back = json.loads(text)
    assert back["mpi_library"] == OPEN_MPI_VERSION[:-1] and back["config"]["data"]["path"] == "/scratch/r\\xe9sultats"
    assert len(back["note"]) < 9000
    write_model(tmp_path, {}, version=1, step=1, attrs={"mpi_library": OPEN_MPI_VERSION, "host": b"n\xff",
                                                       "paths": [NOT_UTF8], "huge": HUGE})
    _, attrs = read_model(tmp_path / "model.h5")
    assert attrs["mpi_library"] == OPEN_MPI_VERSION[:-1] and attrs["host"] == "n\\xff"
    assert json.loads(attrs["paths"]) == ["/scratch/r\\xe9sultats"] and len(attrs["huge"]) < 9000


@pytest.mark.parametrize("value, error", [(OPEN_MPI_VERSION, ValueError), (NOT_UTF8, UnicodeEncodeError)],
                         ids=["NUL", "not UTF-8"])
def test_h5py_alone_refuses_these_values(value, error, tmp_path):
    """Why the rule is needed: each value fails as a trace's string attribute as it comes. (A huge
    string does not: HDF5 keeps it in its global heap; it is cut only to keep outputs small.)"""
    with h5py.File(tmp_path / "f.h5", "w", libver=("earliest", "v108")) as f, pytest.raises(error):
        f.attrs["x"] = value


def test_only_ascii_digits_are_digits():
    assert ascii_digits("0") and ascii_digits("1234")
    for text in ("", "\u00b2", "1\u00b2", "\u0663", "\uff11", "-1", "1.0", " 1", "1 "):
        assert not ascii_digits(text), text


def test_a_rank_or_size_in_superscript_digits_is_not_read_as_one():
    assert rank_from_env({"PMI_RANK": "\u00b2"}) == 0
    assert world_size_from_env({"PMI_SIZE": "\u00b2\u00b2"}) == 1
    assert local_ranks({"MPI_LOCALNRANKS": "\u0663", "PMI_SIZE": "4"}) == 4


@pytest.mark.parametrize("name, label", [
    ("digits-mlp", "digits-mlp"),
    ("a\0b", "a_b"),
    ("../../etc/passwd", ".._.._etc_passwd"),
    ("/abs/path", "abs_path"),
    ("r\u00e9sultats 2", "r_sultats_2"),
    ("..", "run"),
    ("", "run"),
    ("\0\0", "run"),
])
def test_a_job_name_becomes_a_label_that_stays_in_its_directory(name, label):
    assert path_label(name) == label
    assert path_label("x" * 300) == "x" * LABEL_CHARS


def test_an_options_numbers_are_ascii():
    """argparse's int and float took '٣' as 3 and '٥' as 5.0 (`simulate --workers ٣` ran 3 workers)."""
    import argparse

    from ebsp_mpi.safe_text import integer, number

    assert integer(" -12 ") == -12 and number("1e-3") == 0.001
    for bad in ("٣", "３", "1.5", "", "0x10"):
        with pytest.raises(ValueError):
            integer(bad)
    with pytest.raises(ValueError):
        number("٥")
    parser = argparse.ArgumentParser()
    parser.add_argument("--workers", type=integer)
    with pytest.raises(SystemExit):
        parser.parse_args(["--workers", "٣"])


@pytest.mark.parametrize("command", [
    ["train"], ["simulate"], ["sweep", "jobs/sweeps/none.toml"], ["report", "somewhere"], ["compare", "a", "b"],
])
@pytest.mark.parametrize("out", ["", "  "])
def test_an_empty_out_is_refused_not_taken_as_the_default(command, out, tmp_path, capsys, monkeypatch):
    """``--out ""`` ran in the default directory, silently."""
    from ebsp_mpi.cli import main

    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as stop:
        main([*command, "--out", out])
    assert stop.value.code == 2
    assert "argument --out: invalid directory value" in capsys.readouterr().err
    assert not any(tmp_path.iterdir())  # nothing made, in the default runs/ or elsewhere
