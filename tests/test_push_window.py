"""Pushes read in place (``runtime.shared_pushes``; ``runtime.transport.push_window``): a worker on a
server's node leaves its gradient in a shared window and the server reads it there.

Reading in place changes how the bytes reach the server, not which: BSP gives the same weights to the
last bit as with every chunk sent as a message, with one server and with two, and the byte counts
are the same. Where the pair cannot read in place (SFB layers, streamed rounds, the option off) the
run says so in its trace. Each launch carries a timeout.
"""

import json
from pathlib import Path

import pytest

from ebsp_mpi.trace import read_run
from mpirun import max_abs_difference, train

BSP = ["sync.model=bsp", "stop.iterations=30", "optim.momentum=0.9", "straggler.enabled=false",
       "runtime.chunk_bytes=4096"]


def in_place(run_dir: Path) -> list[int]:
    """The workers whose pushes rank 0 read in place (its trace's ``pushes_in_place``)."""
    return list(read_run(run_dir)[0].attrs["pushes_in_place"])


def byte_counts(run_dir: Path) -> list:
    return json.loads((run_dir / "summary.json").read_text())["bytes"]


@pytest.mark.mpi_impl
@pytest.mark.parametrize("servers", [1, 2])
def test_bsp_read_in_place_gives_the_weights_of_bsp_by_messages_bit_for_bit(servers, tmp_path):
    n = servers + 2
    shared = train(n, tmp_path / "shared", f"runtime.servers={servers}", *BSP, timeout=180)
    assert shared.returncode == 0, shared.stderr
    sent = train(n, tmp_path / "sent", f"runtime.servers={servers}", "runtime.shared_pushes=false", *BSP,
                 timeout=180)
    assert sent.returncode == 0, sent.stderr
    assert in_place(tmp_path / "shared") == [0, 1]
    assert in_place(tmp_path / "sent") == []
    assert max_abs_difference(tmp_path / "shared", tmp_path / "sent") == 0.0
    assert byte_counts(tmp_path / "shared") == byte_counts(tmp_path / "sent")


@pytest.mark.parametrize("wire", [["comm.hybrid=sfb"], ["runtime.stream_rounds=true"]], ids=["sfb", "streamed"])
def test_a_run_that_cannot_read_in_place_sends_its_pushes(wire, tmp_path):
    p = train(3, tmp_path, *BSP, *wire, timeout=180)
    assert p.returncode == 0, p.stderr
    assert in_place(tmp_path) == []


def test_asp_read_in_place_trains_and_counts_every_push(tmp_path):
    p = train(3, tmp_path, "sync.model=asp", "stop.iterations=60", "straggler.slowdown=[1, 2]",
              "straggler.base_s=0.002", timeout=180)
    assert p.returncode == 0, p.stderr
    assert in_place(tmp_path) == [0, 1]
    s = json.loads((tmp_path / "summary.json").read_text())
    assert s["iterations"] == [60, 60] and s["rejected_pushes"] == 0
    assert s["test_accuracy"] >= 0.9, s["test_accuracy"]
