"""Neural networks on NumPy or CuPy: layers, models, loss, SGD and schedules over a ``ParamSpace``.

Pure array code (``xp`` is a parameter): no MPI here. All parameters of a model live in one flat
buffer (:class:`ParamSpace`) so the runtime can push and pull them without packing copies; the
sufficient factors of dense layers (Poseidon's SFB) likewise in one (:class:`FactorSpace`).
"""

from .base import Layer
from .factors import FactorBlock, FactorSpace, rebuild_gradient, stack_factors
from .layers import Conv2D, Dense, Flatten, MaxPool2D, ReLU
from .losses import cross_entropy_sum, log_softmax, softmax_cross_entropy
from .model import KINDS, Model, build_model
from .optim import SGD
from .params import ParamSpace, TensorSpec, TensorView
from .schedules import SCHEDULES, make_schedule

__all__ = [
    "ParamSpace", "TensorSpec", "TensorView",
    "FactorSpace", "FactorBlock", "rebuild_gradient", "stack_factors",
    "Layer", "Dense", "Conv2D", "MaxPool2D", "ReLU", "Flatten",
    "Model", "build_model", "KINDS",
    "softmax_cross_entropy", "cross_entropy_sum", "log_softmax",
    "SGD", "make_schedule", "SCHEDULES",
]
