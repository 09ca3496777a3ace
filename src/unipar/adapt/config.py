"""What a user sets to let a job choose its own batch size and learning rate."""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

from unipar import checks


class LRRule(Enum):
    """How the learning rate follows the batch size (see :mod:`unipar.adapt.lr`)."""

    ADASCALE = "adascale"  # SGD: lr × gain (Johnson et al. 2020)
    SQRT = "sqrt"  # Adam/AdamW: lr × √S (Krizhevsky 2014; Malladi et al. 2022)
    POLLUX = "pollux"  # Adam/AdamW: lr × √gain (AdaptDL's AdamScale, Qiao et al. 2021)


@dataclass(frozen=True)
class AdaptiveBatch:
    """Adapt the global batch between ``min_global_batch`` (None: the job's
    ``global_batch_size``, M0, for which its learning rate and schedule were written, and
    where a run starts) and ``max_global_batch``. A batch below M0 makes less progress per
    step and more per sample: the same gain r = S·E, with S = M/M0 < 1, sets its learning
    rate and progress. Bounds that are equal hold the batch there, at any size: the
    learning rate and progress still follow it from M0 by the rule (a fixed batch under
    the same rules as the adaptive one).

    ``lr_rule`` None picks the optimizer's default (ADASCALE for SGD, POLLUX for Adam);
    every ``adapt_every`` steps the goodput-optimal batch is chosen; ``smoothing`` is
    the weight of the past in the exponential averages of the noise estimates, per M0
    samples (a step of batch M keeps ``smoothing ** (M / M0)`` of the past:
    :class:`~unipar.adapt.noise.NoiseEstimate`).
    """

    max_global_batch: int
    lr_rule: LRRule | None = None
    adapt_every: int = 20
    smoothing: float = 0.9
    max_local_batch: int | None = None  # per-worker micro-batch bound (None: memory plan's)
    min_global_batch: int | None = None  # the smallest batch (None: M0, as Pollux's)

    def __post_init__(self) -> None:
        checks.integer("AdaptiveBatch.max_global_batch", self.max_global_batch, minimum=1)
        if self.lr_rule is not None:
            checks.member("AdaptiveBatch.lr_rule", self.lr_rule, LRRule)
        checks.integer("AdaptiveBatch.adapt_every", self.adapt_every, minimum=1)
        checks.number("AdaptiveBatch.smoothing", self.smoothing, minimum=0, below=1)
        if self.max_local_batch is not None:
            checks.integer("AdaptiveBatch.max_local_batch", self.max_local_batch, minimum=1)
        if self.min_global_batch is not None:
            checks.integer("AdaptiveBatch.min_global_batch", self.min_global_batch, minimum=1)
        if self.lr_rule is not None:
            object.__setattr__(self, "lr_rule", LRRule(self.lr_rule))
