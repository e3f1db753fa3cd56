"""The PyTorch peers of ``bench train``: the job's network built in PyTorch, trained in one process.

``python -m ebsp_mpi.bench.torch_peer --device cuda [--set KEY=VALUE ...]`` trains the job's model
(the same layers as :func:`ebsp_mpi.nn.model.build_model`: an MLP, or the LeNet-like CNN) with
momentum SGD at the job's learning rate and weight decay, on the minibatches worker 0 of a
one-worker run draws (``build.batch_stream``), for ``stop.iterations`` steps, and prints one JSON
line: ``{"samples_per_second": ..., "wall_seconds": ..., "test_accuracy": ...}``.

Each step copies its minibatch from host memory to the device, as a worker of ours does. One
untimed step first, so that the clock does not count cuBLAS's and cuDNN's set-up (which our runs'
clocks do count: the comparison leans towards PyTorch, not towards us). The clock stops once the
device has finished the last step. Needs ``torch`` (``pip install torch``), not a dependency.
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import time


def torch_model(job, ds):
    """The job's network in PyTorch (an ``nn.Sequential``), layer for layer as ours builds it."""
    from torch import nn

    hidden, channels = list(job.model.hidden), list(job.model.channels)
    layers: list = []
    if job.model.kind == "mlp":
        widths = [math.prod(ds.input_shape)] + hidden
        layers.append(nn.Flatten())
        for a, b in itertools.pairwise(widths):
            layers += [nn.Linear(a, b), nn.ReLU()]
        features = widths[-1]
    elif job.model.kind == "cnn":
        c_in, h, w = ds.input_shape
        for c in channels:
            layers += [nn.Conv2d(c_in, c, 3, padding=1), nn.ReLU()]
            if h >= 2 and w >= 2:   # ours leaves the pool out once the image is below 2 x 2
                layers.append(nn.MaxPool2d(2))
                h, w = h // 2, w // 2
            c_in = c
        layers.append(nn.Flatten())
        features = c_in * h * w
        if hidden:
            layers += [nn.Linear(features, hidden[0]), nn.ReLU()]
            features = hidden[0]
    else:
        raise SystemExit(f"the PyTorch peer has no model.kind = {job.model.kind!r}")
    layers.append(nn.Linear(features, ds.num_classes))
    return nn.Sequential(*layers)


def optimizer(job, model):
    import torch

    return torch.optim.SGD(model.parameters(), lr=job.optim.lr, momentum=job.optim.momentum,
                           nesterov=job.optim.nesterov, weight_decay=job.optim.weight_decay)


def accuracy(model, ds, device: str) -> float:
    import torch

    with torch.no_grad():
        logits = model(torch.from_numpy(ds.x_test).to(device))
        return float((logits.argmax(1).cpu() == torch.from_numpy(ds.y_test)).float().mean())


def train_single(overrides: list[str], device: str) -> dict:
    """Train the job in this process on `device`; its samples per second, wall seconds and accuracy."""
    import torch
    from torch import nn

    from .. import build
    from ..config import load_job

    torch.set_num_threads(1)
    job = load_job(None, overrides)
    if not job.stop.iterations:
        raise SystemExit("the PyTorch peer needs stop.iterations > 0")
    ds = build.dataset(job)
    torch.manual_seed(job.seed)
    model = torch_model(job, ds).to(device)
    opt = optimizer(job, model)
    loss_fn = nn.CrossEntropyLoss()
    x_train, y_train = torch.from_numpy(ds.x_train), torch.from_numpy(ds.y_train)
    stream = build.batch_stream(job, ds, 0, 1)

    def step():
        idx = torch.from_numpy(stream.next_indices())
        x, y = x_train[idx].to(device), y_train[idx].to(device)
        opt.zero_grad(set_to_none=True)
        loss_fn(model(x), y).backward()
        opt.step()

    def wait():
        if device.startswith("cuda"):
            torch.cuda.synchronize()

    step()   # untimed: library set-up
    wait()
    t0 = time.perf_counter()
    for _ in range(job.stop.iterations):
        step()
    wait()
    wall = time.perf_counter() - t0
    return {"samples_per_second": job.stop.iterations * job.data.batch_size / wall, "wall_seconds": wall,
            "test_accuracy": accuracy(model, ds, device)}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m ebsp_mpi.bench.torch_peer",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cpu", help="PyTorch's device: cpu, cuda or cuda:N (default cpu)")
    parser.add_argument("--set", dest="set", action="append", default=[], metavar="KEY=VALUE")
    args = parser.parse_args(argv)
    import torch

    if args.device.startswith("cuda") and not torch.cuda.is_available():
        raise SystemExit("the PyTorch peer: --device cuda but PyTorch sees no CUDA device")
    print(json.dumps(train_single(args.set, args.device)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
