"""``runtime.servers_alone``: a launch that put a worker beside a server is refused at start-up in one
line naming the nodes and ranks (the rank-to-node map every rank learns at set-up)."""

import pytest

from ebsp_mpi.runtime.rank.placement import servers_alone_refusal, workers_beside_servers
from mpirun import train


def test_servers_alone_on_their_nodes_pass():
    # Hydra's -hosts n1,n2,n3,n4,n5,n6 with 2 servers: servers on n1, n2, workers on n3..n6
    assert workers_beside_servers(["n1", "n2", "n3", "n4", "n5", "n6"], servers=2) == {}
    assert servers_alone_refusal(["n1", "n2", "n2", "n3"], servers=1) == ""


def test_a_worker_beside_a_server_is_named_with_its_node():
    # 6 ranks on -hosts n1..n5 with 2 servers: worker rank 5 wraps onto n1, beside server 0
    hosts = ["n1", "n2", "n3", "n4", "n5", "n1"]
    assert workers_beside_servers(hosts, servers=2) == {"n1": ([0], [5])}
    # co-located, 2 servers and 2 workers a node (-ppn 2 would put both servers on n1)
    shared = workers_beside_servers(["n1", "n2", "n1", "n2"], servers=2)
    assert shared == {"n1": ([0], [2]), "n2": ([1], [3])}
    line = servers_alone_refusal(["n1", "n1", "n1", "n2"], servers=2)
    assert "n1 runs server ranks 0, 1 and worker rank 2" in line and "\n" not in line


@pytest.mark.timeout(180)
def test_a_launch_on_one_node_is_refused_when_the_job_asks_for_servers_alone(tmp_path):
    p = train(3, tmp_path / "run", "runtime.servers_alone=true", "stop.iterations=3")
    assert p.returncode == 2, p.stdout + p.stderr
    errors = [line for line in p.stderr.splitlines() if "error" in line]
    assert len(errors) == 1 and "server rank 0 and worker ranks 1, 2" in errors[0], p.stderr
    assert "Traceback" not in p.stderr and not (tmp_path / "run").exists()
