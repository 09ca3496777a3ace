"""Learning-rate rules for a batch S = M/M0 times the one the rate was written for, and
the scale-invariant progress that drives the schedule.

- ADASCALE (Johnson et al. 2020, "AdaScale SGD", Alg. 1): lr × r, the gain
  r = (var + sqr) / (var/S + sqr) (:func:`unipar.goodput.table.gain`), for SGD.
- SQRT: lr × √S, the square-root rule for Adam (Malladi et al. 2022, "On the SDEs and
  scaling rules for adaptive gradient algorithms").
- POLLUX: lr × √r, AdaptDL's AdamScale (Qiao et al. 2021, Pollux's artifact).
Progress (AdaScale §3): each step advances the schedule by r steps of batch M0, so a
schedule written in M0-steps stays right at any batch; efficiency = r / S (Pollux eq. 6).

``var`` here is tr(Σ) per sample (what :mod:`unipar.adapt.noise` estimates); the gain's
variance is that of a batch-M0 gradient, tr(Σ)/M0 (AdaScale eq. 5; Pollux §3.1, whose
``grad_var`` is at M0), so r = (φ + M0)·S / (φ + M0·S) with φ = tr(Σ)/|G|² = B_simple.
"""

from __future__ import annotations

import math

from unipar.adapt.config import LRRule
from unipar.errors import ConfigError
from unipar.goodput.table import gain
from unipar.optimizer import OptimizerKind

# The optimizers a learning-rate rule is known for (Adagrad has none).
RULED_KINDS = (OptimizerKind.SGD, OptimizerKind.ADAM, OptimizerKind.ADAMW)


def default_rule(optimizer_kind: OptimizerKind) -> LRRule:
    """ADASCALE for SGD, POLLUX for Adam and AdamW."""
    return LRRule.ADASCALE if optimizer_kind is OptimizerKind.SGD else LRRule.POLLUX


def allowed_rules(optimizer_kind: OptimizerKind) -> tuple[LRRule, ...]:
    """The rules known for ``optimizer_kind`` (none for Adagrad)."""
    if optimizer_kind is OptimizerKind.SGD:
        return (LRRule.ADASCALE,)
    if optimizer_kind in RULED_KINDS:
        return (LRRule.SQRT, LRRule.POLLUX)
    return ()


def var_at_init(var: float, init_batch: float) -> float:
    """tr(Σ) per sample as the variance of a gradient over ``init_batch`` samples."""
    return var / init_batch


def lr_factor(rule: LRRule, batch: float, init_batch: float, sqr: float, var: float) -> float:
    """The factor on the learning rate written for ``init_batch`` at ``batch``
    (``var``: tr(Σ) per sample)."""
    r = progress_step(batch, init_batch, sqr, var)
    if rule is LRRule.ADASCALE:
        return r
    if rule is LRRule.SQRT:
        return math.sqrt(batch / init_batch)
    if rule is LRRule.POLLUX:
        return math.sqrt(r)
    raise ConfigError(f"no learning-rate rule {rule!r}; pass one of {list(LRRule)}")


def efficiency(batch: float, init_batch: float, sqr: float, var: float) -> float:
    """Statistical efficiency E = r/S: progress per sample relative to batch M0."""
    return progress_step(batch, init_batch, sqr, var) / (batch / init_batch)


def progress_step(batch: float, init_batch: float, sqr: float, var: float) -> float:
    """Scale-invariant steps (in steps of batch M0) one step at ``batch`` makes."""
    return float(gain(batch, init_batch, sqr, var_at_init(var, init_batch)))
