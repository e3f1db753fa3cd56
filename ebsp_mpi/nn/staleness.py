"""Staleness-aware updates: how a push computed on old weights is applied (``optim.staleness``).

A push's staleness τ is the number of versions applied between the pull its gradient was computed on
and its own application, plus one: a push applied on the weights it was computed on has τ = 1.

- ``none``: the push is applied as it is.
- ``scale``: its learning rate is divided by τ (Zhang, Gupta, Lian, Liu, "Staleness-aware Async-SGD
  for distributed deep learning", IJCAI 2016).
- ``dc``: DC-ASGD's delay compensation (Zheng et al., "Asynchronous stochastic gradient descent with
  delay compensation", ICML 2017): the gradient g, computed on the pulled weights w_pulled, is
  replaced by ``g + λ·g⊙g⊙(w_now − w_pulled)``, a first-order correction towards the gradient at the
  current weights with the outer product of g standing in for the Hessian (λ = ``optim.dc_lambda``).
  It needs the weights each worker pulled: the server keeps them (``nn.versions``), one copy per
  version that some worker still computes on.

BSP's rounds are applied on the weights every member pulled (τ = 1), so no rule changes them.
Pure array code: the parameter server and the emulated trainer apply the same rule.
"""

from __future__ import annotations

RULES = ("none", "scale", "dc")


class StalenessRule:
    """One of :data:`RULES` with its λ.

    Parameters
    ----------
    rule : str
        ``"none"``, ``"scale"`` or ``"dc"``.
    dc_lambda : float
        DC-ASGD's λ (>= 0); read only by ``"dc"``.
    """

    def __init__(self, rule: str = "none", dc_lambda: float = 0.04):
        if rule not in RULES:
            raise ValueError(f"optim.staleness = {rule!r}: must be one of {', '.join(RULES)}")
        if not dc_lambda >= 0:
            raise ValueError(f"optim.dc_lambda = {dc_lambda!r}: must be >= 0")
        self.rule, self.dc_lambda = rule, float(dc_lambda)

    @property
    def needs_pulled_weights(self) -> bool:
        """Whether :meth:`gradient` reads the weights the push was computed on."""
        return self.rule == "dc"

    def lr(self, lr: float, staleness: int) -> float:
        """The learning rate of a push of staleness τ (``staleness`` >= 1)."""
        if staleness < 1:
            raise ValueError(f"staleness must be >= 1 (1: computed on the current weights), got {staleness}")
        return lr / staleness if self.rule == "scale" else lr

    def gradient(self, grad, w_now, w_pulled, scratch):
        """The gradient to apply in place of `grad` (left unchanged): `grad` itself but under ``dc``,
        where it is ``grad + λ·grad⊙grad⊙(w_now − w_pulled)``, written into `scratch` (same shape)."""
        if self.rule != "dc" or w_pulled is w_now:
            return grad
        # in-place operators: the same code on NumPy and CuPy arrays, and no temporaries
        scratch[...] = w_now
        scratch -= w_pulled
        scratch *= grad
        scratch *= grad
        scratch *= self.dc_lambda
        scratch += grad
        return scratch
