"""Gradient noise scale from the squared norms of small and big batch gradients.

McCandlish et al. 2018 ("An Empirical Model of Large-Batch Training"), App. A.1: with
|G_small|² the squared norm of a gradient over B_small samples and |G_big|² over
B_big > B_small samples, unbiased estimates are
  |G|²  ≈ (B_big·|G_big|² − B_small·|G_small|²) / (B_big − B_small)
  tr(Σ) ≈ (|G_small|² − |G_big|²) / (1/B_small − 1/B_big)
Each is noisy, so both are averaged separately (exponential moving averages, bias
corrected as Adam's moments) before their ratio B_simple = tr(Σ)/|G|². Here the small
gradients are the local ones (per replica, or per micro-batch with one replica) and the
big one is their mean. Pollux (Qiao et al. 2021, §3.1) measures Adam's gradients
preconditioned; the runtime measures raw ones (why: :mod:`unipar.adapt.norms`); this
estimator is the same for both.
"""

from __future__ import annotations

from dataclasses import dataclass, replace


@dataclass(frozen=True)
class NoiseSample:
    """One step's norms: the mean of ``count`` local squared norms, each of ``small_batch``
    samples, and the squared norm of their mean (``count × small_batch`` samples)."""

    small_sq: float
    big_sq: float
    small_batch: float
    count: int


def unbiased(sample: NoiseSample) -> tuple[float, float]:
    """(|G|², tr(Σ)) of one step, McCandlish et al. 2018, App. A.1 (may be negative)."""
    b_small = sample.small_batch
    b_big = b_small * sample.count
    sqr = (b_big * sample.big_sq - b_small * sample.small_sq) / (b_big - b_small)
    var = (sample.small_sq - sample.big_sq) / (1.0 / b_small - 1.0 / b_big)
    return sqr, var


@dataclass(frozen=True)
class NoiseEstimate:
    """Smoothed |G|² (``sqr``) and tr(Σ) (``var``, per sample), with Adam-style bias
    correction of both moving averages (``weight`` = 1 − the product of the past's
    weights).

    ``smoothing`` is the past's weight per ``per_samples`` samples (0: per step): a step
    of ``n`` samples keeps ``smoothing ** (n / per_samples)`` of the past, so the
    averages span the same samples whatever the batch, as AdaptDL's estimator weighs
    its steps (``theta = smoothing ** scale``, the batch over the initial one; Qiao et
    al. 2021's artifact). A small batch's noisier steps are averaged over more of them;
    a large batch's few steps follow the noise as training changes it."""

    smoothing: float = 0.9
    sqr_avg: float = 0.0
    var_avg: float = 0.0
    weight: float = 0.0
    per_samples: float = 0.0

    def update(self, sample: NoiseSample) -> NoiseEstimate:
        """The estimate after one more step (a step with one local gradient is skipped)."""
        if sample.count < 2:
            return self
        sqr, var = unbiased(sample)
        s = self.smoothing
        if self.per_samples > 0:
            s **= sample.small_batch * sample.count / self.per_samples
        return replace(
            self,
            sqr_avg=s * self.sqr_avg + (1 - s) * sqr,
            var_avg=s * self.var_avg + (1 - s) * var,
            weight=s * self.weight + (1 - s),
        )

    @property
    def ready(self) -> bool:
        return self.weight > 0

    @property
    def sqr(self) -> float:
        """|G|², floored at a tiny positive value (the estimate can dip below zero)."""
        return max(self.sqr_avg / self.weight, 1e-30) if self.ready else 1.0

    @property
    def var(self) -> float:
        """tr(Σ) per sample, floored at zero."""
        return max(self.var_avg / self.weight, 0.0) if self.ready else 0.0

    @property
    def noise_scale(self) -> float:
        """B_simple = tr(Σ)/|G|² (McCandlish et al. 2018, eq. 2.8)."""
        return self.var / self.sqr
