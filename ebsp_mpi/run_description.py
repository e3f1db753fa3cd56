"""A job resolved once per process: the run it describes, which every part of the run reads instead of
working it out again.

:func:`read_osdp_plan` is the one place a process reads the OSDP plan file the job names
(``osdp.plan``): the command line reads it once, checks its structure, and hands it down to the
trainer (the MPI roles or the reference trainer). :func:`describe` checks it once against the model
and ``osdp.memory_limit``, and adds what every trainer needs besides: the dataset, the model's shape,
each worker's iteration limit. Models, layout, checkpoints and summary take the plan from there;
nothing reads or checks it again.

Pure: no MPI (the MPI launch adds the layout of the run's messages on its ranks, ``runtime.launch``).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

import numpy as np

from . import build
from .config import JobConfig
from .data import BatchStream, Dataset
from .nn import Model


@dataclass(frozen=True)
class OsdpPlan:
    """The OSDP plan file a job names, as read once.

    Attributes
    ----------
    path : str
        The file (``osdp.plan``).
    doc : dict
        Its contents, their structure checked (``plan.osdp_files.read_plan``).
    sha256 : str
        SHA-256 of the file as read: a checkpoint holds it, so that a resumed run refuses a plan
        changed since.
    """

    path: str
    doc: dict
    sha256: str

    @property
    def on_demand(self) -> frozenset:
        """The tensors of the plan's on-demand layers, which a worker fetches instead of holding."""
        from .plan.osdp_schedule import on_demand_tensors

        return on_demand_tensors(self.doc)

    @property
    def fetched_layers(self) -> list[str]:
        """The names of the layers the plan fetches on demand, in forward order."""
        return [layer["name"] for layer in self.doc["layers"] if layer["mode"] == "on-demand"]

    @property
    def predicted(self) -> dict:
        """What the planner predicted of a worker: ``peak_bytes``, ``iteration_s`` (None if absent)."""
        predicted = self.doc.get("predicted", {})
        return {"peak_bytes": predicted.get("peak_bytes"), "iteration_s": predicted.get("iteration_s")}


def read_osdp_plan(job: JobConfig) -> OsdpPlan | None:
    """The plan file `job` names, read and checked; None when it names none.

    Raises
    ------
    OsdpFileError
        The file is missing or not a plan (one line naming ``osdp.plan`` and the file).
    """
    if not job.osdp.plan:
        return None
    from .plan.osdp_files import read_plan

    doc = read_plan(job.osdp.plan)
    # the digest of the file the document came from; should it change in between, a resumed run
    # refuses it, which is the safe side
    try:
        sha256 = hashlib.sha256(Path(job.osdp.plan).read_bytes()).hexdigest()
    except OSError:
        sha256 = ""
    return OsdpPlan(path=job.osdp.plan, doc=doc, sha256=sha256)


@dataclass(frozen=True)
class RunDescription:
    """What a run is, worked out once from its job.

    Attributes
    ----------
    job : JobConfig
    workers : int
        The data-parallel workers (their shards of the data, their iteration limits).
    dataset : Dataset
    plan : OsdpPlan or None
        The OSDP plan, read and checked once (None: every layer resident).
    skeleton : Model
        The job's model without buffers (``build.skeleton``): its layers and every tensor's place.
    identity : Identity or None
        What the run is made from (``ebsp_mpi.identity``): its checkpoints and summary record it.
    layout : Layout or None
        How the run's messages go on this launch's ranks (``runtime.transport.layout.Layout``), added
        by the MPI launch (``runtime.launch.make_role``) for every role to take; None outside MPI.
    """

    job: JobConfig
    workers: int
    dataset: Dataset
    plan: OsdpPlan | None
    skeleton: Model
    identity: object = None
    layout: object = None

    @cached_property
    def limits(self) -> tuple[int | None, ...]:
        """Per worker, its iterations before it stops (``stop.iterations``, ``stop.epochs``); None: only a
        time limit. Worked out when first asked, after the model is built: a model that does not suit
        the data is the error a user should see first, before a shard too small for a batch."""
        return tuple(build.iteration_limit(self.job, self.batch_stream(w).batches_per_epoch)
                     for w in range(self.workers))

    @property
    def plan_doc(self) -> dict | None:
        """The plan file's contents (None without a plan)."""
        return self.plan.doc if self.plan is not None else None

    @property
    def plan_sha256(self) -> str:
        """The plan file's digest for checkpoints ("" without a plan)."""
        return self.plan.sha256 if self.plan is not None else ""

    def model(self, xp=np, on_demand: bool = False) -> Model:
        """The job's model, initialised from the seed; with `on_demand` without the plan's on-demand
        layers in its buffers (an OSDP worker's)."""
        tensors = self.plan.on_demand if on_demand and self.plan is not None else frozenset()
        return build.model(self.job, self.dataset, xp=xp, on_demand=tensors)

    def batch_stream(self, worker: int) -> BatchStream:
        """Worker `worker`'s minibatches."""
        return build.batch_stream(self.job, self.dataset, worker, self.workers)


def describe(job: JobConfig, workers: int, plan: OsdpPlan | None, identity=None) -> RunDescription:
    """The run of `job` with `workers` workers and the plan already read (:func:`read_osdp_plan`):
    loads the dataset (the one slow part: call it where a failure is reported, e.g. in an MPI rank's
    set-up), and checks the plan against the model and the model against ``osdp.memory_limit``, once.

    Raises
    ------
    ModelError, OsdpFileError
        A model that does not suit the data or this machine, a plan made for another model or batch
        size, a worker that would need more than ``osdp.memory_limit`` (one line each).
    ValueError
        `plan` is None although the job names one: a caller that forgot to read it would train
        without it, silently.
    """
    if job.osdp.plan and plan is None:
        raise ValueError(f"describe: osdp.plan = {job.osdp.plan!r} was not read (run_description.read_osdp_plan)")
    dataset = build.dataset(job)
    skeleton = build.skeleton(job, dataset)
    doc = plan.doc if plan is not None else None
    build.check_osdp_plan(job, skeleton, doc)
    build.check_memory_limit(job, skeleton, doc)
    return RunDescription(job=job, workers=workers, dataset=dataset, plan=plan, skeleton=skeleton,
                          identity=identity)
