"""A synthetic classification task labelled by a random teacher network.

Inputs are standard Gaussian vectors; the labels are the argmax of a random
two-layer MLP's logits, ``argmax(tanh(x W1) W2)``, so the task is learnable
exactly by a student of the same shape and its size scales freely for scale runs.
Everything derives from one seed.
"""

from __future__ import annotations

import numpy

from .errors import DatasetError
from .memory import exceeds_memory, format_bytes, memory_phrase

# Mixed into the seed so that inputs and teacher come from separate streams
# (and neither shares one with the train/test split or the batch order).
INPUT_STREAM = 0x1A9
TEACHER_STREAM = 0x7EAC
CHUNK = 8192


def teacher_labels(x: numpy.ndarray, num_classes: int, hidden: int, seed: int) -> numpy.ndarray:
    """Labels of ``x`` under the teacher network drawn from ``seed``.

    ``W1`` is Gaussian with variance 1/D, so the hidden pre-activations are
    standard normal and tanh works in its curved range. There are no biases and
    every column of ``W2`` has unit norm: tanh is odd and the inputs symmetric,
    so no class is favoured on average and the classes come out roughly
    balanced (a bias or a long column would hand one class most samples).

    Parameters
    ----------
    x : numpy.ndarray
        float32 ``(N, D)``.
    num_classes, hidden : int
        Output classes and width of the tanh hidden layer.
    seed : int

    Returns
    -------
    numpy.ndarray
        int64 ``(N,)`` labels in ``[0, num_classes)``.
    """
    rng = numpy.random.default_rng([seed, TEACHER_STREAM])
    features = x.shape[1]
    w1 = rng.standard_normal((features, hidden)) / numpy.sqrt(features)
    w2 = rng.standard_normal((hidden, num_classes))
    w2 /= numpy.linalg.norm(w2, axis=0)
    labels = numpy.empty(x.shape[0], dtype=numpy.int64)
    for start in range(0, x.shape[0], CHUNK):
        logits = numpy.tanh(x[start:start + CHUNK] @ w1) @ w2
        labels[start:start + CHUNK] = numpy.argmax(logits, axis=1)
    return labels


def load_synthetic(samples: int, features: int, classes: int, hidden: int, seed: int):
    """Draw ``samples`` Gaussian inputs and label them with the teacher.

    Returns
    -------
    x : numpy.ndarray
        float32 ``(samples, features)``.
    y : numpy.ndarray
        int64 ``(samples,)``.
    num_classes : int
    input_shape : tuple
        ``(features,)``.
    """
    for key, value, least in (("synthetic_samples", samples, 2), ("synthetic_features", features, 1),
                              ("synthetic_classes", classes, 2), ("synthetic_hidden", hidden, 1)):
        if isinstance(value, bool) or not isinstance(value, (int, numpy.integer)) or value < least:
            raise DatasetError(f"data.{key} = {value!r}; expected an integer >= {least}")
    _require_fits(samples, features, classes, hidden)
    rng = numpy.random.default_rng([seed, INPUT_STREAM])
    x = rng.standard_normal((samples, features), dtype=numpy.float32)
    return x, teacher_labels(x, classes, hidden, seed), int(classes), (int(features),)


def _require_fits(samples: int, features: int, classes: int, hidden: int) -> None:
    """Refuse a task whose arrays exceed the physical memory, before drawing them.

    Counted: the float32 inputs twice (drawn, then copied by the train/test split), the int64 labels
    twice, and the teacher's float64 weights and one chunk of its hidden activations and logits.
    """
    data = samples * (features * 4 + 8) * 2
    teacher = 8 * (features * hidden + hidden * classes + CHUNK * (hidden + classes))
    if exceeds_memory(data + teacher):
        raise DatasetError(f"data.synthetic_samples = {samples}, synthetic_features = {features}, "
                           f"synthetic_classes = {classes}, synthetic_hidden = {hidden} need "
                           f"{format_bytes(data + teacher)} (inputs {format_bytes(data)}, teacher network "
                           f"{format_bytes(teacher)}), more than {memory_phrase()}; make them smaller")
