"""The update of one shard of the weights: what a push or a BSP round does to them, without messages.

Every server rank applies its shard's pushes and rounds through a :class:`ShardUpdate`
(``runtime.servers.shard``, which adds the messages), and so does the emulated trainer (``sim.training``), on
the whole model as one shard: so ``simulate --train`` and a live run step the weights with the same
code. An asynchronous push, in order:

1. the learning rate of its staleness (``optim.staleness``, ``nn.staleness``): the schedule's rate at
   the version before the step, divided by τ = version − used + 1 under ``scale``;
2. under ``dc``, the delay-compensated gradient (DC-ASGD), read against the weights the push was
   computed on, which the version store keeps while some worker holds them (``nn.versions``);
3. the version bookkeeping: the worker lets go of its version, and the current one is copied if
   another worker still holds it;
4. the optimizer step over the shard.

A BSP round is never stale: the mean of its members' gradients, summed in worker order
(``nn.average.round_mean``; ``SGD.step_mean`` forms it inside the step), as one step at the rate of
its version, over any slice of the shard at a time (a streamed round steps it chunk by chunk,
docs/design.md "Streamed BSP rounds"): per element the same float operations as one step over the
whole buffer.
"""

from __future__ import annotations

import numpy as np

from .kernels import all_finite
from .staleness import StalenessRule
from .versions import VersionStore


class ShardUpdate:
    """The optimizer step of elements [lo, hi) of `params`.

    Parameters
    ----------
    params : array
        The whole flat weight buffer; only [lo, hi) is changed.
    opt : optimizer
        ``build.optimizer``: its ``step(params, grad, lr, offset=...)`` and ``velocity``.
    lr_at : callable
        The learning-rate schedule, by version (``build.schedule``).
    rule : StalenessRule
    lo, hi : int
        The shard (default: all of `params`).
    versions : VersionStore or None
        The held versions of ``params[lo:hi]``, counted in this shard's steps; None: none kept (then
        no DC correction either: a BSP round is never stale).
    round_based : bool
        Rounds are applied (BSP): a buffer for their mean.
    """

    def __init__(self, params, opt, lr_at, rule: StalenessRule, lo: int = 0, hi: int | None = None,
                 versions: VersionStore | None = None, round_based: bool = False):
        self.params, self.opt, self.lr_at, self.rule = params, opt, lr_at, rule
        self.lo, self.hi = lo, params.size if hi is None else hi
        self.view = params[self.lo:self.hi]
        self.versions = versions
        self.dc = rule.needs_pulled_weights and versions is not None
        self.held_by: dict[int, int] = {}  # worker -> the version it computes on (its push's, until taken)
        self.dc_buf = np.empty_like(self.view) if self.dc else None
        self.dc_ready: tuple[int, int] | None = None  # (worker, version) whose corrected step dc_buf holds
        self.mean_buf = np.empty_like(params) if round_based else None  # a round's mean, by flat offsets

    # -- versions ---------------------------------------------------------------------------------

    def hold(self, w: int, version: int | None = None) -> None:
        """`w` is given the current weights (`version`, when said, must be the current one) to compute on."""
        if self.versions is not None:
            version = self.versions.version if version is None else version
            self.versions.hold(version)
            self.held_by[w] = version

    def let_go(self, w: int) -> None:
        """`w`'s push is taken (applied or rejected) or `w` stops: the version it held goes."""
        held = self.held_by.pop(w, None)
        if held is not None:
            self.versions.release(held)

    def pulled_weights(self, w: int):
        """The weights `w` computes on (the live buffer while no step has changed them)."""
        return self.versions.of(self.held_by[w])

    # -- an asynchronous push ---------------------------------------------------------------------

    def step_finite(self, w: int, grad) -> bool:
        """Whether `w`'s step with `grad` (the shard's part of its gradient), worked out on the weights
        as they are now, is finite: the DC-corrected one under ``dc`` (kept for :meth:`apply` while
        the weights stay as they are), else True (the gradient's own check is the step's)."""
        if not self.dc:
            return True
        step = self._corrected(w, grad)
        self.dc_ready = (w, self.versions.version) if step is self.dc_buf else None
        return bool(all_finite(step))

    def apply(self, w: int, grad, version: int, used: int) -> bool:
        """Apply `w`'s push, the gradient `grad` computed on version `used`, as one step at the learning
        rate of `version` (the version before it). False, and nothing applied, when the DC-corrected
        step is not finite and no :meth:`step_finite` checked it on these weights."""
        lr = self.rule.lr(self.lr_at(version), version - used + 1)
        step = grad
        if self.dc:
            checked, self.dc_ready = self.dc_ready == (w, self.versions.version), None
            step = self.dc_buf if checked else self._corrected(w, grad)
            if not checked and not all_finite(step):
                return False
        self.let_go(w)  # before the step: a version no one holds any more is not copied
        self._step(self.view, step, lr, self.lo)
        return True

    def _corrected(self, w: int, grad):
        with np.errstate(over="ignore", invalid="ignore"):  # a step that overflows is checked, not warned of
            return self.rule.gradient(grad, self.view, self.pulled_weights(w), self.dc_buf)

    # -- a BSP round ------------------------------------------------------------------------------

    def round_step(self, grads: list, s: slice, version: int) -> None:
        """Slice `s` (flat offsets within the shard) of a round's step: the mean of `grads` (the
        members' whole gradient buffers, in worker order) at the learning rate of `version`."""
        if self.versions is not None:
            self.versions.changing(self.versions.version + 1)
        self.opt.step_mean(self.params[s], [g[s] for g in grads], self.lr_at(version), offset=s.start,
                           out=self.mean_buf[s] if self.mean_buf is not None else None)

    def _step(self, params, step, lr: float, offset: int) -> None:
        if self.versions is not None:
            self.versions.changing(self.versions.version + 1)
        self.opt.step(params, step, lr, offset=offset)
