"""Evaluation on the server, one slice at a time, so the message loop is never held for long.

The server copies the parameters into the evaluator's own model when an evaluation starts (so the
version evaluated is well defined while pushes keep changing the live parameters), then calls
:meth:`Evaluator.step` once per pass of its loop: each call runs the forward pass of at most
``eval.batch_size`` test samples. The loop is thus held for one slice at a time — about a millisecond
for the digits MLP at 512 samples — and serves messages between slices.
"""

from __future__ import annotations

import time

import numpy as np

from ...nn.losses import cross_entropy_sum


class Evaluator:
    """Test loss and accuracy of parameter snapshots, computed incrementally.

    Parameters
    ----------
    model : Model
        A model with the server's layout; its parameter buffer receives the snapshots.
    x, y : numpy.ndarray
        The test split.
    batch_size : int
        Samples per slice.
    """

    def __init__(self, model, x: np.ndarray, y: np.ndarray, batch_size: int):
        self.model, self.x, self.y, self.batch_size = model, x, y, batch_size
        self.active = False

    def start(self, params: np.ndarray, version: int, t: float) -> None:
        """Snapshot `params` (global `version`, run time `t`) and begin evaluating it."""
        np.copyto(self.model.space.data, params)
        self.version, self.t = version, t
        self.pos, self.loss_sum, self.correct, self.seconds = 0, 0.0, 0, 0.0
        self.active = True

    def step(self):
        """Evaluate the next slice; at the last one return ``(t, version, loss, accuracy, seconds)``."""
        t0 = time.perf_counter()
        stop = min(self.pos + self.batch_size, len(self.y))
        loss, correct = cross_entropy_sum(self.model.forward(self.x[self.pos:stop]), self.y[self.pos:stop])
        self.loss_sum += float(loss)
        self.correct += int(correct)
        self.pos = stop
        self.seconds += time.perf_counter() - t0
        if self.pos < len(self.y):
            return None
        self.active = False
        n = len(self.y)
        return self.t, self.version, self.loss_sum / n, self.correct / n, self.seconds

    def evaluate_now(self, params: np.ndarray) -> tuple[float, float]:
        """Evaluate `params` in full at once (at the end of a run): ``(loss, accuracy)``."""
        np.copyto(self.model.space.data, params)
        return self.model.evaluate(self.x, self.y, batch_size=self.batch_size)
