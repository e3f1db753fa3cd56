"""From a job to the objects a run needs: dataset, model, optimizer, learning-rate schedule.

The single-process trainer, the parameter server and the workers all build through here, so they
agree on every shape, seed and hyper-parameter by construction.
"""

from __future__ import annotations

import numpy as np

from .config import JobConfig
from .data import BatchStream, Dataset, load_dataset
from .data.memory import exceeds_memory, format_bytes, memory_phrase
from .errors import UsageError
from .nn import SGD, Model, build_model, make_schedule
from .nn.model import model_specs
from .sync.registry import round_based


def dataset(job: JobConfig) -> Dataset:
    d = job.data
    return load_dataset(d.name, root=d.root, path=d.path, test_fraction=d.test_fraction, seed=job.seed,
                        normalize=d.normalize, max_train=d.max_train, synthetic_samples=d.synthetic_samples,
                        synthetic_features=d.synthetic_features, synthetic_classes=d.synthetic_classes,
                        synthetic_hidden=d.synthetic_hidden, samples=d.samples)


class ModelError(UsageError, ValueError):
    """A model the job asks for that cannot be built here: wrong for the data, or larger than memory."""


#: Bytes per parameter besides its ``dtype`` buffers: the float64 initial values drawn on the host.
INIT_DRAW_BYTES = 8
#: Buffers of ``dtype`` per parameter: the values, the gradients, the optimizer's velocity.
BUFFERS = 3


def model(job: JobConfig, ds: Dataset, xp=np, dtype=np.float32, on_demand=frozenset(), held: bool = True) -> Model:
    """The job's model for dataset ``ds``, initialised from ``job.seed``; the tensors in `on_demand`
    (an OSDP worker's on-demand layers) are left out of its ``ParamSpace`` buffers, and without `held`
    every tensor is (:func:`skeleton`). The OSDP plan and ``osdp.memory_limit`` are checked once per
    process, where the run is described (``run_description.describe``), not here.

    Raises
    ------
    ModelError
        Before allocating anything, when the model does not suit the data (a CNN on vectors, fewer
        than 2 classes) or its parameters would not fit in this machine's memory.
    """
    m = job.model
    _check_suits_data(job, ds)
    try:
        specs = model_specs(m.kind, ds.input_shape, ds.num_classes, hidden=tuple(m.hidden),
                            channels=tuple(m.channels), kernels=tuple(m.kernels))
    except ValueError as e:  # a layer that does not fit its input (a kernel wider than the padded sequence)
        raise ModelError(f"model.kind = {m.kind!r} on data.name = {job.data.name!r} (inputs {ds.input_shape}): "
                         f"{e}") from None
    check_model_fits(job, ds, specs, np.dtype(dtype))
    resident = [s.name for s in specs if s.name not in on_demand] if on_demand else None
    return build_model(m.kind, ds.input_shape, ds.num_classes, hidden=tuple(m.hidden),
                       channels=tuple(m.channels), kernels=tuple(m.kernels), xp=xp, dtype=dtype, seed=job.seed,
                       resident=resident if held else [])


def skeleton(job: JobConfig, ds: Dataset) -> Model:
    """The job's model without buffers: its layers and each tensor's place in the ``ParamSpace``,
    allocating no parameter. What a process works out once from the model's shape (the OSDP plan's
    check, the memory limit, the layout of its messages) reads this instead of a model of its own."""
    return model(job, ds, held=False)


def check_osdp_plan(job: JobConfig, model: Model, plan: dict | None) -> None:
    """Check the OSDP plan the job names (``osdp.plan``), as read (``run_description.read_osdp_plan``),
    against `model` and ``data.batch_size``; None: the job names none (every layer resident).

    Raises
    ------
    OsdpFileError
        A plan made for another model or batch size (one line).
    """
    if plan is None:
        return
    from .plan.osdp_files import check_plan, model_layers

    check_plan(plan, model_layers(model), job.data.batch_size, f"osdp.plan = {job.osdp.plan!r}")


def check_memory_limit(job: JobConfig, model: Model, plan: dict | None) -> None:
    """Refuse a run whose worker would need more than ``osdp.memory_limit``: the plan's predicted peak,
    or, without a plan, the weights and gradients of every layer (a lower bound: activations add to it).

    Raises
    ------
    ModelError
        One line with both figures and the command that plans under the limit.
    """
    if not job.osdp.memory_limit:
        return
    from .plan.sizes import format_size, parse_size

    try:
        limit = parse_size(job.osdp.memory_limit, "osdp.memory_limit =")
    except ValueError as e:
        raise ModelError(str(e)) from None
    where = f"osdp.memory_limit = {job.osdp.memory_limit!r} ({format_size(limit)})"
    if plan is None:
        need = 2 * model.space.size * model.space.dtype.itemsize  # the whole model's, held or not
        if need > limit:
            raise ModelError(f"{where}: every layer resident needs at least {format_size(need)} per worker (weights "
                             f"and gradients of {model.space.size} parameters); plan which layers to fetch on demand: "
                             f"python -m ebsp_mpi plan JOB --memory-limit {job.osdp.memory_limit}")
        return
    need = int(plan.get("predicted", {}).get("peak_bytes", 0))
    if need > limit:
        raise ModelError(f"{where}: the plan in osdp.plan = {job.osdp.plan!r} predicts a peak of {format_size(need)} "
                         f"per worker; plan again under this limit: python -m ebsp_mpi plan JOB --memory-limit "
                         f"{job.osdp.memory_limit}")


def _check_suits_data(job: JobConfig, ds: Dataset) -> None:
    if ds.num_classes < 2:
        raise ModelError(f"the output layer would have {ds.num_classes} class ({ds.classes_from}); "
                         f"a classifier needs labels of at least 2 classes")
    if job.model.kind in ("cnn", "cnn1d") and len(ds.input_shape) != 3:
        raise ModelError(f"model.kind = {job.model.kind!r} needs images (C, H, W), but data.name = "
                         f"{job.data.name!r} holds vectors of shape {ds.input_shape}; use model.kind = 'mlp'")


def model_bytes(specs, dtype: np.dtype) -> int:
    """Bytes a rank holds for a model's parameters at most while it builds and trains.

    Counted per parameter: its value, gradient and optimizer velocity in ``dtype``, and the float64
    initial value drawn on the host (:meth:`ParamSpace.init`). Not counted: activations (they scale
    with the batch), the server's second copy for evaluation and its one gradient buffer per worker.
    """
    return sum(s.size for s in specs) * (BUFFERS * dtype.itemsize + INIT_DRAW_BYTES)


def check_model_fits(job: JobConfig, ds: Dataset, specs, dtype: np.dtype) -> None:
    """Refuse a model whose parameters exceed this machine's physical memory (:func:`model_bytes`).

    The message names the size, the largest tensor and the job key or dataset property it comes from.
    """
    need = model_bytes(specs, dtype)
    if not exceeds_memory(need):
        return
    count = sum(s.size for s in specs)
    largest = max(specs, key=lambda s: s.size)
    shape = " x ".join(map(str, largest.shape))
    raise ModelError(f"the model needs {format_bytes(need)} per rank, more than {memory_phrase()}: {count} "
                     f"parameters at {BUFFERS * dtype.itemsize + INIT_DRAW_BYTES} bytes each (value, gradient "
                     f"and optimizer velocity in {dtype}, and the float64 initial value); the largest tensor, "
                     f"{largest.name} ({shape}), {_origin(job, ds, specs, largest)}")


def _origin(job: JobConfig, ds: Dataset, specs, largest) -> str:
    """Where the largest tensor's size comes from, and what to change."""
    m = job.model
    if largest is specs[-2]:  # the output layer's weights: (inputs, num_classes)
        return (f"is the output layer's, with {ds.num_classes} classes because {ds.classes_from}; labels "
                f"must be 0, 1, ..., K-1 for K classes: renumber them without gaps")
    if m.kind == "cnn":
        return (f"comes from model.hidden = {m.hidden} and model.channels = {m.channels} on inputs of shape "
                f"{ds.input_shape}; use smaller model.hidden or model.channels")
    return (f"comes from model.hidden = {m.hidden} on inputs of shape {ds.input_shape}; use narrower layers, "
            f"e.g. --set model.hidden=[128]")


def optimizer(job: JobConfig, size: int, xp=np, dtype=np.float32, fused: bool | None = None) -> SGD:
    o = job.optim
    return SGD(size, momentum=o.momentum, nesterov=o.nesterov, weight_decay=o.weight_decay, xp=xp, dtype=dtype,
               fused=fused)


def schedule(job: JobConfig):
    """Learning rate as a function of the optimizer step (the global model version)."""
    o = job.optim
    total = o.total_steps or job.stop.iterations or None
    return make_schedule(o.schedule, o.lr, total_steps=total, warmup_steps=o.warmup_steps,
                         step_size=o.step_size, gamma=o.gamma, min_lr=o.min_lr)


def batch_stream(job: JobConfig, ds: Dataset, worker: int, workers: int) -> BatchStream:
    """Worker `worker`'s minibatches: the same indices in the oracle and on MPI rank worker+1."""
    return BatchStream(len(ds.y_train), job.data.batch_size, worker=worker, workers=workers, seed=job.seed)


def iteration_limit(job: JobConfig, batches_per_epoch: int) -> int | None:
    """Iterations per worker allowed by ``stop.iterations`` and ``stop.epochs`` (None: only a time limit)."""
    limits = []
    if job.stop.iterations:
        limits.append(job.stop.iterations)
    if job.stop.epochs:
        limits.append(max(1, int(np.ceil(job.stop.epochs * batches_per_epoch))))
    return min(limits) if limits else None


def hybrid_plan(job: JobConfig, model: Model, workers: int) -> tuple[set[str], dict]:
    """``comm.hybrid``'s plan for this model and launch (the same on every rank): the names of the
    weight tensors that travel as sufficient factors, and the plan as plain data (per tensor its scheme
    and the cost model's bytes per iteration; ``ebsp_mpi.plan.hybcomm``).

    Raises
    ------
    ModelError
        ``comm.hybrid = "sfb"`` on a model with no dense layer.
    """
    from .nn.layers import Dense
    from .plan.hybcomm import choose

    layers = []
    for layer in model.layers:
        for name in getattr(layer, "tensor_names", ()):
            shape = model.space.view(name).shape
            dense = isinstance(layer, Dense) and len(shape) == 2
            # Poseidon's M x N is the gradient's out x in; a bias or a kernel only needs its size
            m, n = (int(shape[1]), int(shape[0])) if dense else (int(shape[0]), int(np.prod(shape[1:], dtype=int)))
            layers.append((name, m, n, dense))
    try:
        # the servers share every layer's traffic: the cost model prices a push by the busiest server's share
        plan = choose(layers, batch=job.data.batch_size, workers=workers, servers=job.runtime.servers,
                      synchronous=round_based(job.sync), mode=job.comm.hybrid,
                      sfb_overhead_bytes=job.comm.sfb_overhead_bytes)
    except ValueError as e:
        raise ModelError(f"comm.hybrid = {job.comm.hybrid!r}: {e}") from None
    return set(plan.sfb_layers), plan.as_dict()
