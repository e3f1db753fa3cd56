"""Emulated training (``simulate --train``): the simulated schedule with real weights, in one process.

Virtual worker w draws the batches live worker w would (``build.batch_stream``: its shard, reshuffled
by ``(seed, w, epoch)``) and computes its gradient on the weights of the version it was released with;
its push is applied when the coordinator says, through the update every server rank applies to its
shard (``nn.shard_update``: learning-rate schedule and staleness rule, DC-ASGD, version bookkeeping,
optimizer step, BSP round mean in worker order), here on the whole model as one shard, with the NaN
rule. Real compute time is not virtual time: the schedule comes from the straggler model
or a recording. Evaluations run at virtual times (``eval.every_seconds``), on the weights as they were
then.

Weights of a version live only while a worker holds them (``nn.versions.VersionStore``): copied when
a step would overwrite a version some worker still computes on, dropped with its last holder. The peak
number of copies is reported (``training.peak_versions``), so the memory is at most (copies + 2) model
sizes for the weights, plus one gradient per push not yet applied (BSP: a round's).
"""

from __future__ import annotations

import math
import time

import numpy as np

from .. import build
from ..config import JobConfig
from ..divergence import DivergenceWatch
from ..errors import UsageError
from ..nn.kernels import all_finite
from ..nn.shard_update import ShardUpdate
from ..nn.staleness import StalenessRule
from ..nn.versions import VersionStore
from ..outputs import AccuracyTargets
from ..sync.registry import round_based
from .events import Trainer

#: Evaluations a run may ask for (``eval.every_seconds`` against its virtual length): each is a row of
#: the server's ``evals`` and of the summary, so past this the job is refused, in one line
MAX_EVALUATIONS = 100_000


def check_evaluations(job: JobConfig, until: float) -> None:
    """Refuse, before the run, a time limit (``stop.seconds``) at which ``eval.every_seconds`` asks for
    more than :data:`MAX_EVALUATIONS`; a run stopped by its iterations is held to the bound as it goes."""
    every = job.eval.every_seconds
    if every > 0 and until < np.inf and not until / every < MAX_EVALUATIONS:
        raise _too_many(every, until / every, until)


def _too_many(every: float, due: float, t: float) -> UsageError:
    many = f"{math.ceil(due)} evaluations" if due < np.inf else "more evaluations than a float can count"
    return UsageError(f"simulate --train: eval.every_seconds = {every:g} asks for {many} by "
                      f"{t:.6g} simulated s, more than {MAX_EVALUATIONS} (each a row of the trace and the summary); "
                      f"evaluate less often")


def check_emulable(job: JobConfig) -> None:
    """One line on what emulated training cannot do the way the live runtime does, else nothing."""
    if job.osdp.plan:
        raise UsageError("simulate --train: an OSDP plan (osdp.plan) changes what a worker holds, not what it "
                         "computes; emulate the job without it (--set osdp.plan=)")
    if job.comm.hybrid != "ps":
        raise UsageError(f"simulate --train: comm.hybrid = {job.comm.hybrid!r}: sufficient factors are rebuilt "
                         "on the server in another summation order; emulate with --set comm.hybrid=ps")


class EmulatedTrainer(Trainer):
    """The weights of one emulated run (a ``RunDescription``: its job, workers, data and limits)."""

    def __init__(self, description, chunk_bytes: int | None = None):
        job, workers = description.job, description.workers
        check_emulable(job)
        self.job, self.n, self.description = job, workers, description
        # wait-free backprop: a live worker computes each dense layer's weight gradient in row blocks of
        # its messages (nn.layers.row_blocks), whose GEMMs sum in their own order; so does the replay
        wfbp = job.runtime.wait_free_backprop and chunk_bytes
        self.blocks = {"on_grad_ready": _ignore, "block_elems": int(chunk_bytes) // 4} if wfbp else {}
        self.ds = description.dataset
        self.model = description.model()                  # computes every worker's gradient in turn
        self.params = self.model.space.data.copy()        # the server's weights, initialised alike
        # Only BSP's round keeps pushes unapplied past the next gradient; every other model applies (or
        # rejects) a push within its own event, so its gradient is read where the model left it
        self.keep_gradients = round_based(job.sync)
        # the server's update of the whole model as one shard (nn.shard_update), whose version store keeps
        # the weights of every version a worker computes on, under every model
        self.update = ShardUpdate(self.params, build.optimizer(job, self.params.size), build.schedule(job),
                                  StalenessRule(job.optim.staleness, job.optim.dc_lambda),
                                  versions=VersionStore(self.params), round_based=self.keep_gradients)
        self.streams = [description.batch_stream(w) for w in range(workers)]
        self.pending: dict[int, tuple[np.ndarray, int]] = {}  # pushed, not yet applied: (gradient, version used)
        self.free: list[np.ndarray] = []
        self.model_holds: int | None = None  # the version in the model's buffer (None: not known)
        self.last_loss = np.full(workers, np.nan)
        self.version = 0
        self.evals: list[tuple[float, int, float, float]] = []
        self.targets = AccuracyTargets(list(job.eval.targets))
        self.divergence = DivergenceWatch.for_job(job, self.ds.y_test)
        self.every = job.eval.every_seconds
        self.next_eval = self.every if self.every > 0 else np.inf
        self.evaluated: tuple[int, float, float] | None = None  # (version, loss, accuracy) last computed
        self.gradients = 0
        self.rejected = 0
        self.compute_seconds = 0.0

    def begin(self, t0: float) -> None:
        """The run starts at virtual time `t0`: the first evaluation is due ``eval.every_seconds`` later."""
        self.next_eval = t0 + self.every if self.every > 0 else np.inf

    # -- the simulation's events ------------------------------------------------------------------

    def released(self, worker: int, version: int) -> None:
        self.update.hold(worker, version)

    def pushed(self, worker: int, t: float) -> bool:
        if self.next_eval <= t:
            self.evaluate_until(t)
        used = self.update.held_by[worker]
        c0 = time.perf_counter()
        if self.model_holds != used:  # BSP's workers all compute on one version: copied once a round
            self.model.space.data[...] = self.update.pulled_weights(worker)
            self.model_holds = used
        idx = self.streams[worker].next_indices()
        self.last_loss[worker] = self.model.loss_and_grad(self.ds.x_train[idx], self.ds.y_train[idx], **self.blocks)
        grad = self.model.space.grad
        if self.keep_gradients:
            grad = self.free.pop() if self.free else np.empty_like(self.params)
            np.copyto(grad, self.model.space.grad)
        self.compute_seconds += time.perf_counter() - c0
        self.gradients += 1
        self.pending[worker] = (grad, used)
        if not all_finite(grad):
            return True
        # applied within this push's event, on the weights as they are now: the corrected step is worked
        # out (and kept) here, and a push whose step is not finite is rejected, never applied
        return self.update.dc and not self.keep_gradients and not self.update.step_finite(worker, grad)

    def apply(self, worker: int, version: int) -> None:
        grad, used = self.pending.pop(worker)
        self.divergence.push(version - used)
        if not self.update.apply(worker, grad, version, used):  # checked by pushed(), on these weights
            raise RuntimeError(f"worker {worker}'s step was applied unchecked and is not finite")
        self.version += 1

    def round(self, members: tuple[int, ...], version: int) -> None:
        taken = [self.pending.pop(w) for w in members]
        for w in members:
            self.update.let_go(w)  # before the step: a version no one holds any more is not copied
            self.divergence.push(0)  # a round's pushes were all computed on the weights it steps from
        if taken:
            self.update.round_step([g for g, _ in taken], slice(0, self.params.size), version)
            self.version += 1
        self.free += [g for g, _ in taken]

    def reject(self, worker: int) -> None:
        self.rejected += 1
        grad, _ = self.pending.pop(worker)
        self.update.let_go(worker)
        if self.keep_gradients:
            self.free.append(grad)

    @property
    def versions(self) -> VersionStore:
        """The weights of the versions workers compute on."""
        return self.update.versions

    # -- evaluations ------------------------------------------------------------------------------

    def evaluate_until(self, t: float) -> None:
        """Every evaluation due at a virtual time up to `t`, on the weights as they are (no push after
        its time has been applied yet)."""
        if self.next_eval > t:
            return
        due = len(self.evals) + (t - self.next_eval) / self.every + 1  # a float: 1e-320 s gives inf
        if not due <= MAX_EVALUATIONS:
            raise _too_many(self.every, due, t)
        while self.next_eval <= t:
            self._evaluate(self.next_eval)
            self.next_eval += self.every

    def _evaluate(self, t: float) -> tuple[float, float]:
        """The test loss and accuracy of the weights as they are; weights no step has changed since they
        were last evaluated are not evaluated again (evaluations between two steps take no time)."""
        if self.evaluated is None or self.evaluated[0] != self.version:
            self.model.space.data[...] = self.params
            self.model_holds = self.version
            loss, acc = self.model.evaluate(self.ds.x_test, self.ds.y_test, batch_size=self.job.eval.batch_size)
            self.evaluated = (self.version, float(loss), float(acc))
        _, loss, acc = self.evaluated
        self.evals.append((t, self.version, float(loss), float(acc)))
        self.targets.observe(t, acc)
        self.divergence.observe(t, self.version, float(loss), float(acc))
        return float(loss), float(acc)

    def finish(self, t_end: float) -> tuple[float, float]:
        """The evaluations left up to the end, and the final one: ``(test loss, test accuracy)``."""
        self.evaluate_until(t_end)
        return self._evaluate(t_end)

    def state_dict(self) -> dict[str, np.ndarray]:
        """The trained tensors by name, for ``model.h5`` (as the server writes them)."""
        self.model.space.data[...] = self.params
        self.model_holds = self.version
        return self.model.space.state_dict()

    def statistics(self) -> dict:
        heard = self.last_loss[np.isfinite(self.last_loss)]
        return {"gradients": self.gradients, "compute_seconds": self.compute_seconds,
                "peak_versions": self.versions.peak_copies, "model_bytes": int(self.params.nbytes),
                "staleness_rule": self.update.rule.rule, "train_loss": float(heard.mean()) if heard.size else None}


def _ignore(*_) -> None:
    """A gradient block is ready: the emulation has nowhere to send it."""
