"""A stall names the silent ranks' nodes with every rank on them: a lost node (its link cut, its
processes killed) takes all its ranks, while the rank that stops waited for one of them only. Without
MPI running (MPI_Abort replaced)."""

import numpy as np
import pytest
from mpi4py import MPI

from ebsp_mpi.runtime.rank import abort
from ebsp_mpi.runtime.transport import deadlines
from ebsp_mpi.runtime.transport.context import Context
from ebsp_mpi.runtime.transport.failures import StallError
from ebsp_mpi.runtime.transport.polling import Backoff, wait_all

# ranks 0, 1 servers; n2 holds server 1 and worker rank 5, as in .ci/cluster-check.sh's cut-bsp-server
HOSTS = ["n1", "n2", "n3", "n4", "n1", "n2"]


def test_the_note_names_every_rank_of_a_silent_ranks_node():
    note = abort.node_note((1,), HOSTS, 0, 2)
    assert note == "; a lost node takes all its ranks: n2 runs rank 1 (server 1), rank 5 (worker 3)"
    both = abort.node_note((1, 2), HOSTS, 3, 2)
    assert "n2 runs rank 1 (server 1), rank 5 (worker 3); n3 runs rank 2 (worker 0)" in both


@pytest.mark.parametrize("silent, rank, hosts", [
    ((4,), 0, HOSTS),  # rank 4 shares rank 0's node, which runs: it is no lost node
    ((), 0, HOSTS),  # who is silent is not known
    ((1,), 0, []),  # the ranks' hosts are not known (a failure before the job started)
    ((9,), 0, HOSTS),  # no such rank
])
def test_no_note_where_no_other_node_is_known_silent(silent, rank, hosts):
    assert abort.node_note(silent, hosts, rank, 2) == ""


class Aborted(Exception):
    pass


def test_a_stopping_rank_names_every_rank_of_the_silent_node(monkeypatch, capsys):
    class World:
        @staticmethod
        def Abort(code):
            raise Aborted(code)

    class FakeMPI:
        COMM_WORLD = World

    monkeypatch.setattr(abort, "MPI", FakeMPI)
    monkeypatch.setattr(abort.time, "sleep", lambda s: None)
    monkeypatch.setattr(abort.signal, "alarm", lambda s: 0)
    ctx = Context(comm=None, rank=0, size=6, local_rank=0, servers=2, hosts=HOSTS)
    with pytest.raises(Aborted):
        abort.abort(ctx, StallError("server rank 1 silent for 10.0 s", [1]))
    line = capsys.readouterr().err
    assert line.startswith("ebsp_mpi: rank 0 (server 0) stopped: StallError: server rank 1 silent for 10.0 s; ")
    assert line.rstrip().endswith("n2 runs rank 1 (server 1), rank 5 (worker 3)")


def test_a_wait_says_which_ranks_are_silent(monkeypatch):
    clock = [0.0]
    monkeypatch.setattr(deadlines.time, "monotonic", lambda: clock[0])
    arrived = {0}
    silence = deadlines.Silence(4.0, "the servers", ranks=lambda: sorted({0, 1} - arrived))
    clock[0] = 4.1
    with pytest.raises(StallError) as raised:
        silence.check()
    assert raised.value.ranks == (1,)
    assert StallError("no one named").ranks == ()


def test_a_worker_names_the_ranks_of_the_requests_still_open():
    from ebsp_mpi.runtime.worker.loop import _missing

    assert _missing([0, 1, 1, 0], {0, 3}) == [1]
    assert _missing([0, 1], {0, 1}) == [0]  # all came: the wait was on the server's keep-alive


def test_a_wait_does_its_idle_work_between_polls_that_find_nothing():
    """A server waiting for another server's shard still sends its keep-alives (``on_idle``): else its
    held workers take it for silent and name it, alive, beside the lost node's ranks."""
    self_ = MPI.COMM_SELF
    got, sent = np.zeros(1), np.ones(1)
    receive = self_.Irecv(got, 0, 7)
    idle, sends = [], []

    def on_idle():
        idle.append(1)
        if len(idle) == 3:  # the message comes after three idle polls
            sends.append(self_.Isend(sent, 0, 7))

    wait_all([receive], Backoff(), on_idle=on_idle)
    wait_all(sends, Backoff())
    assert len(idle) >= 3 and got[0] == 1.0
