"""The description of a training job: what to train, on what, for how long.

A :class:`Job` holds factories rather than objects, so every worker process builds
its own model, dataset and optimizer from the same recipe and the same seed.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

import torch
from torch import nn

from unipar import validate
from unipar.adapt.config import AdaptiveBatch

ModelFactory = Callable[[], nn.Module]
DatasetFactory = Callable[[], "torch.utils.data.Dataset[Any]"]
LossFunction = Callable[[Any, Any], torch.Tensor]
OptimizerFactory = Callable[[Iterable[nn.Parameter]], torch.optim.Optimizer]
# samples -> (inputs, targets), each a tensor or a tuple/list/dict of them, nested
CollateFunction = Callable[[list[Any]], tuple[Any, Any]]
# (model, (inputs, targets), ctx) -> loss; ctx: unipar.runtime.step_context.StepContext
StepFunction = Callable[[nn.Module, tuple[Any, Any], Any], torch.Tensor]


class ModelCall(Enum):
    """How the model takes a batch's inputs: ``model(inputs)`` (``POSITIONAL``), or
    ``model(**inputs)`` for a dict of named inputs (``KWARGS``, the Hugging Face
    convention: ``input_ids``, ``attention_mask``, ...)."""

    POSITIONAL = "positional"
    KWARGS = "kwargs"

    def __call__(self, model: Callable[..., Any], inputs: Any) -> Any:
        """``model`` applied to ``inputs`` this way."""
        return model(**inputs) if self is ModelCall.KWARGS else model(inputs)


class OptimizerKind(Enum):
    ADAMW = "adamw"
    ADAM = "adam"
    SGD = "sgd"


@dataclass(frozen=True)
class OptimizerSpec:
    """An optimizer by name and hyperparameters (see ``torch.optim``)."""

    kind: OptimizerKind = OptimizerKind.ADAMW
    lr: float = 3e-4
    weight_decay: float = 0.0
    betas: tuple[float, float] = (0.9, 0.95)
    momentum: float = 0.0

    def __post_init__(self) -> None:
        validate.check_optimizer(self)
        object.__setattr__(self, "kind", OptimizerKind(self.kind))

    def build(self, params: Iterable[nn.Parameter]) -> torch.optim.Optimizer:
        params = list(params)
        if self.kind is OptimizerKind.ADAMW:
            return torch.optim.AdamW(
                params, lr=self.lr, betas=self.betas, weight_decay=self.weight_decay
            )
        if self.kind is OptimizerKind.ADAM:
            return torch.optim.Adam(
                params, lr=self.lr, betas=self.betas, weight_decay=self.weight_decay
            )
        return torch.optim.SGD(
            params, lr=self.lr, momentum=self.momentum, weight_decay=self.weight_decay
        )


class ScheduleKind(Enum):
    CONSTANT = "constant"
    WARMUP_COSINE = "warmup_cosine"
    WARMUP_LINEAR = "warmup_linear"


@dataclass(frozen=True)
class LRSchedule:
    """Learning-rate multiplier per optimizer step.

    Linear warmup then cosine or linear decay to ``min_ratio`` of the base rate
    (the schedule of GPT-3, Brown et al. 2020, Appendix B).
    """

    kind: ScheduleKind = ScheduleKind.CONSTANT
    warmup_steps: int = 0
    min_ratio: float = 0.1

    def __post_init__(self) -> None:
        validate.check_schedule(self)
        object.__setattr__(self, "kind", ScheduleKind(self.kind))

    def multiplier(self, step: int, total_steps: int) -> float:
        if self.warmup_steps and step < self.warmup_steps:
            return (step + 1) / self.warmup_steps
        if self.kind is ScheduleKind.CONSTANT:
            return 1.0
        span = max(1, total_steps - self.warmup_steps)
        progress = min(1.0, (step - self.warmup_steps) / span)
        if self.kind is ScheduleKind.WARMUP_COSINE:
            decay = 0.5 * (1.0 + math.cos(math.pi * progress))
        else:
            decay = 1.0 - progress
        return self.min_ratio + (1.0 - self.min_ratio) * decay


def cross_entropy_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Mean token cross-entropy for ``logits`` [..., vocab] against ``targets`` [...].
    A model output with a ``.logits`` field (a Hugging Face ``ModelOutput``) gives
    its logits."""
    logits = getattr(logits, "logits", logits)
    return nn.functional.cross_entropy(logits.reshape(-1, logits.size(-1)), targets.reshape(-1))


@dataclass(frozen=True)
class Job:
    """What to train.

    The dataset yields ``(inputs, targets)`` pairs; the model maps a batch of
    inputs to outputs and ``loss(outputs, targets)`` reduces them to a scalar mean.
    ``global_batch_size`` counts samples per optimizer step over all workers.

    Inputs and targets may be tensors or tuples, lists or dicts of tensors, nested
    (``{"input_ids": ..., "attention_mask": ...}``); the leading dimension of every
    tensor is the batch dimension. ``collate`` turns a list of samples into a batch
    (default: ``torch.utils.data.default_collate``); ``call`` says whether the model
    takes the batch's inputs as ``model(inputs)`` or ``model(**inputs)``.

    ``step``: your own step, ``step(model, (inputs, targets), ctx) -> loss``, in place
    of ``loss(model(inputs), targets)`` (several losses, a loss that needs other ranks'
    data); ``ctx`` is a :class:`~unipar.runtime.step_context.StepContext` (the run's
    device mesh, its process groups per axis, the plan, the rank). The runtime scales
    the loss and runs backward as for ``loss``.
    """

    model: ModelFactory
    dataset: DatasetFactory
    global_batch_size: int
    steps: int
    loss: LossFunction = cross_entropy_loss
    optimizer: OptimizerSpec | OptimizerFactory = field(default_factory=OptimizerSpec)
    lr_schedule: LRSchedule = field(default_factory=LRSchedule)
    seed: int = 0
    name: str = "job"
    grad_clip_norm: float | None = None
    # adapt the batch (and the learning rate) between global_batch_size and a bound
    adaptive: AdaptiveBatch | None = None
    call: ModelCall = ModelCall.POSITIONAL
    collate: CollateFunction | None = None
    step: StepFunction | None = None

    def __post_init__(self) -> None:
        validate.check_job(self)
        object.__setattr__(self, "call", ModelCall(self.call))

    def build_optimizer(self, params: Iterable[nn.Parameter]) -> torch.optim.Optimizer:
        if isinstance(self.optimizer, OptimizerSpec):
            return self.optimizer.build(params)
        return self.optimizer(params)
