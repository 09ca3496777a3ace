"""The optimizer and learning-rate schedule of a job, as plain data.

One :class:`OptimizerSpec` serves every runtime: the data-parallel workers build a
``torch.optim`` optimizer from it (:meth:`OptimizerSpec.build`), and the parameter
servers run the same update on their shards (:class:`unipar.ps.optim.ShardOptimizer`),
updating an embedding table only at the rows a step pushes (a sparse update: for SGD and
Adagrad the same numbers as a dense one, for Adam the lazy rule of
``torch.optim.SparseAdam``). A leaf: nothing of unipar but errors and checks; torch is
imported only when an optimizer is built.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass
from enum import Enum
from typing import TYPE_CHECKING

from unipar import checks
from unipar.errors import ConfigError

if TYPE_CHECKING:
    import torch


class OptimizerKind(Enum):
    ADAMW = "adamw"
    ADAM = "adam"
    SGD = "sgd"
    ADAGRAD = "adagrad"


# torch.optim's own default ``eps`` of each kind (SGD has none).
_TORCH_EPS = {
    OptimizerKind.ADAMW: 1e-8,
    OptimizerKind.ADAM: 1e-8,
    OptimizerKind.ADAGRAD: 1e-10,
    OptimizerKind.SGD: 0.0,
}


@dataclass(frozen=True)
class OptimizerSpec:
    """An optimizer by name and hyperparameters (see ``torch.optim``): ``momentum``
    is SGD's, ``betas`` Adam's and AdamW's, ``eps`` (None: torch's default for the
    kind, 1e-8 for Adam and AdamW, 1e-10 for Adagrad) Adam's, AdamW's and Adagrad's."""

    kind: OptimizerKind = OptimizerKind.ADAMW
    lr: float = 3e-4
    weight_decay: float = 0.0
    betas: tuple[float, float] = (0.9, 0.95)
    momentum: float = 0.0
    eps: float | None = None

    def __post_init__(self) -> None:
        checks.member("OptimizerSpec.kind", self.kind, OptimizerKind)
        checks.number("OptimizerSpec.lr", self.lr, above=0)
        checks.number("OptimizerSpec.weight_decay", self.weight_decay, minimum=0)
        checks.number("OptimizerSpec.momentum", self.momentum, minimum=0)
        betas = self.betas
        if not isinstance(betas, (tuple, list)) or len(betas) != 2:
            raise ConfigError(
                f"OptimizerSpec.betas must be a pair (beta1, beta2), but got {betas!r}; "
                "pass e.g. (0.9, 0.95)"
            )
        for index, beta in enumerate(betas):
            checks.number(f"OptimizerSpec.betas[{index}]", beta, minimum=0, below=1)
        if self.eps is not None:
            checks.number("OptimizerSpec.eps", self.eps, above=0)
        object.__setattr__(self, "kind", OptimizerKind(self.kind))

    @property
    def epsilon(self) -> float:
        """The ``eps`` the update adds to its denominator."""
        return _TORCH_EPS[self.kind] if self.eps is None else self.eps

    def build(self, params: Iterable[torch.nn.Parameter]) -> torch.optim.Optimizer:
        # torch loads only where an optimizer is built, so a plan or a job file is read,
        # and this module imported, without it
        import torch  # noqa: PLC0415 (heavy: torch)

        params = list(params)
        if self.kind is OptimizerKind.ADAMW:
            return torch.optim.AdamW(
                params, lr=self.lr, betas=self.betas, eps=self.epsilon,
                weight_decay=self.weight_decay,
            )
        if self.kind is OptimizerKind.ADAM:
            return torch.optim.Adam(
                params, lr=self.lr, betas=self.betas, eps=self.epsilon,
                weight_decay=self.weight_decay,
            )
        if self.kind is OptimizerKind.ADAGRAD:
            return torch.optim.Adagrad(
                params, lr=self.lr, eps=self.epsilon, weight_decay=self.weight_decay
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
        checks.member("LRSchedule.kind", self.kind, ScheduleKind)
        checks.integer("LRSchedule.warmup_steps", self.warmup_steps, minimum=0)
        checks.number("LRSchedule.min_ratio", self.min_ratio, minimum=0, maximum=1)
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
