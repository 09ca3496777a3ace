"""The description of a training job: what to train, on what, for how long.

A :class:`Job` holds factories rather than objects, so every worker process builds
its own model, dataset and optimizer from the same recipe and the same seed.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from unipar import checks
from unipar.adapt.config import AdaptiveBatch
from unipar.adapt.lr import RULED_KINDS, allowed_rules
from unipar.errors import ConfigError
from unipar.model_call import ModelCall
from unipar.optimizer import LRSchedule, OptimizerSpec

ModelFactory = Callable[[], nn.Module]
DatasetFactory = Callable[[], "torch.utils.data.Dataset[Any]"]
LossFunction = Callable[[Any, Any], torch.Tensor]
OptimizerFactory = Callable[[Iterable[nn.Parameter]], torch.optim.Optimizer]
# samples -> (inputs, targets), each a tensor or a tuple/list/dict of them, nested
CollateFunction = Callable[[list[Any]], tuple[Any, Any]]
# (model, (inputs, targets), ctx) -> loss; ctx: unipar.runtime.step_context.StepContext
StepFunction = Callable[[nn.Module, tuple[Any, Any], Any], torch.Tensor]


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
        checks.callable_("Job.model", self.model, "a factory returning an nn.Module")
        checks.callable_("Job.dataset", self.dataset, "a factory returning a Dataset")
        checks.callable_("Job.loss", self.loss, "loss(outputs, targets) -> scalar tensor")
        checks.integer("Job.global_batch_size", self.global_batch_size, minimum=1)
        checks.integer("Job.steps", self.steps, minimum=1)
        if not isinstance(self.optimizer, OptimizerSpec):
            checks.callable_(
                "Job.optimizer", self.optimizer, "an OptimizerSpec or a factory(params)"
            )
        if not isinstance(self.lr_schedule, LRSchedule):
            raise ConfigError(
                f"Job.lr_schedule must be an LRSchedule, but got {self.lr_schedule!r}; pass "
                "LRSchedule(ScheduleKind.WARMUP_COSINE, warmup_steps=...) or leave it out"
            )
        checks.integer("Job.seed", self.seed, minimum=0, maximum=2**32 - 1)
        checks.run_name("Job.name", self.name)
        if self.grad_clip_norm is not None:
            checks.number("Job.grad_clip_norm", self.grad_clip_norm, above=0)
        if self.adaptive is not None:
            self._check_adaptive()
        object.__setattr__(self, "call", checks.member("Job.call", self.call, ModelCall))
        if self.collate is not None:
            checks.callable_("Job.collate", self.collate, "collate(samples) -> (inputs, targets)")
        if self.step is not None:
            checks.callable_("Job.step", self.step, "step(model, (inputs, targets), ctx) -> loss")
            if self.adaptive is not None:
                raise ConfigError(
                    "an adaptive batch checks that the job's loss is a mean over samples, which "
                    "it cannot do for a custom Job.step; leave out one of step and adaptive"
                )

    def _check_adaptive(self) -> None:
        """An adaptive batch that fits the job: a bound above M0, a rule for its optimizer."""
        adaptive = self.adaptive
        if not isinstance(adaptive, AdaptiveBatch):
            raise ConfigError(
                f"Job.adaptive must be an AdaptiveBatch or None, but got {adaptive!r}; pass "
                "AdaptiveBatch(max_global_batch=...)"
            )
        if adaptive.max_global_batch < self.global_batch_size:
            raise ConfigError(
                f"AdaptiveBatch.max_global_batch must be at least the job's global_batch_size "
                f"(the initial batch M0), but got max_global_batch={adaptive.max_global_batch} "
                f"< global_batch_size={self.global_batch_size}; pass max_global_batch >= "
                f"{self.global_batch_size} (--max-batch)"
            )
        least = adaptive.min_global_batch
        if least is not None and least > self.global_batch_size:
            raise ConfigError(
                f"AdaptiveBatch.min_global_batch must be at most the job's global_batch_size "
                f"(the initial batch M0, where the run starts), but got min_global_batch="
                f"{least} > global_batch_size={self.global_batch_size}; pass min_global_batch "
                f"<= {self.global_batch_size} or leave it out (M0)"
            )
        optimizer = self.optimizer
        if not isinstance(optimizer, OptimizerSpec) or optimizer.kind not in RULED_KINDS:
            what = (
                "a factory" if not isinstance(optimizer, OptimizerSpec)
                else f"{optimizer.kind.value}"
            )
            raise ConfigError(
                "adaptive batch scales the learning rate by a rule known for SGD, Adam and "
                f"AdamW, but Job.optimizer is {what} with no rule; pass an OptimizerSpec "
                "(kind='sgd', 'adam' or 'adamw') or leave adaptive out"
            )
        allowed = allowed_rules(optimizer.kind)
        if adaptive.lr_rule is not None and adaptive.lr_rule not in allowed:
            names = ", ".join(r.value for r in allowed)
            raise ConfigError(
                f"lr_rule={adaptive.lr_rule.value!r} has no meaning for optimizer "
                f"{optimizer.kind.value!r}; pass one of {names} or leave lr_rule out"
            )

    def build_optimizer(self, params: Iterable[nn.Parameter]) -> torch.optim.Optimizer:
        if isinstance(self.optimizer, OptimizerSpec):
            return self.optimizer.build(params)
        return self.optimizer(params)
