"""The peer of ``bench train``: the same job trained with PyTorch DistributedDataParallel (gloo, CPU).

``python -m ebsp_mpi.bench.ddp --workers N [--set KEY=VALUE ...]`` trains the job's network
(``bench/torch_peer.py``: the same layers, momentum SGD at the job's learning rate and weight decay)
on the same dataset, each of the N processes drawing worker w's minibatches from
``build.batch_stream`` as MPI worker w would, for ``stop.iterations`` steps, and prints one JSON
line: ``{"samples_per_second": ..., "wall_seconds": ..., "test_accuracy": ..., "step_ends": [...]}``.
The clock runs as it does in a run's ``summary.json``: from the moment every process has built its
model (after a barrier) to the end of the last step (after a barrier); ``step_ends`` are rank 0's
seconds on that clock at the end of each step (its all-reduce done).

``--rank R --init tcp://ADDRESS:PORT --result FILE`` runs one process of the N instead, on a node of
its own (``bench cluster`` starts one on each node: gloo's rendezvous on node 1's address, its
traffic on the interface ``GLOO_SOCKET_IFNAME`` names); rank 0 writes the line to FILE.

DDP is BSP by construction (an allreduce of the gradients in every backward pass), so it is the
peer of the BSP rows; the ASP rows show it too, as the synchronous figure a user would otherwise get.
Needs ``torch`` (not a dependency of the project: ``pip install torch``). One thread per process, as
every rank of an MPI run has.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from ..safe_text import integer


def _train(rank: int, workers: int, overrides: list[str], init_method: str, result: str) -> None:
    import torch
    import torch.distributed as dist
    from torch import nn

    from .. import build
    from ..config import load_job
    from .torch_peer import accuracy, optimizer, torch_model

    torch.set_num_threads(1)
    job = load_job(None, overrides)
    if not job.stop.iterations:
        raise SystemExit("bench train's DDP peer needs stop.iterations > 0")
    dist.init_process_group("gloo", init_method=init_method, rank=rank, world_size=workers)
    ds = build.dataset(job)
    torch.manual_seed(job.seed)
    model = nn.parallel.DistributedDataParallel(torch_model(job, ds))
    opt = optimizer(job, model.module)
    loss_fn = nn.CrossEntropyLoss()
    x_train, y_train = torch.from_numpy(ds.x_train), torch.from_numpy(ds.y_train)
    stream = build.batch_stream(job, ds, rank, workers)
    dist.barrier()
    t0 = time.perf_counter()
    step_ends = []
    for _ in range(job.stop.iterations):
        idx = torch.from_numpy(stream.next_indices())
        opt.zero_grad(set_to_none=True)
        loss_fn(model(x_train[idx]), y_train[idx]).backward()  # returns once the all-reduce is done
        opt.step()
        step_ends.append(time.perf_counter() - t0)
    dist.barrier()
    wall = time.perf_counter() - t0
    if rank == 0:
        samples = workers * job.stop.iterations * job.data.batch_size
        with open(result, "w") as f:
            json.dump({"samples_per_second": samples / wall, "wall_seconds": wall,
                       "test_accuracy": accuracy(model.module, ds, "cpu"), "step_ends": step_ends}, f)
    dist.destroy_process_group()


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m ebsp_mpi.bench.ddp", description=__doc__.split("\n\n")[0])
    parser.add_argument("--workers", type=integer, required=True)
    parser.add_argument("--set", dest="set", action="append", default=[], metavar="KEY=VALUE")
    parser.add_argument("--rank", type=int, help="run this one process of --workers (with --init, --result)")
    parser.add_argument("--init", help="gloo's rendezvous of a --rank process: tcp://ADDRESS:PORT")
    parser.add_argument("--result", help="where rank 0 of --rank processes writes its JSON line")
    args = parser.parse_args(argv)
    if args.rank is not None:
        if not (args.init and args.result):
            parser.error("--rank needs --init and --result")
        _train(args.rank, args.workers, args.set, args.init, args.result)
        return 0
    import torch.multiprocessing as mp

    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")  # one machine: gloo talks over loopback only
    with tempfile.TemporaryDirectory(prefix="ebsp-ddp-") as tmp:
        result = os.path.join(tmp, "result.json")
        mp.spawn(_train, args=(args.workers, args.set, "file://" + os.path.join(tmp, "rendezvous"), result),
                 nprocs=args.workers)
        with open(result) as f:
            print(f.read())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
