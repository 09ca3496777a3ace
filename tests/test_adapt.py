"""Pure pieces of the adaptive batch: noise estimator, LR rules, chooser (no Ray)."""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import pytest
import torch

from unipar.adapt.chooser import choose, fit_error, per_shape
from unipar.adapt.config import LRRule
from unipar.adapt.lr import efficiency, lr_factor, progress_step
from unipar.adapt.noise import NoiseEstimate, NoiseSample, unbiased
from unipar.adapt.norms import check_mean_loss, squared_norm
from unipar.errors import ConfigError
from unipar.goodput.throughput import Observation, ThroughputModel, fit


def _sample(rng, sqr_true, var_true, dim, micro, count):
    """Norms of ``count`` gradients of ``micro`` samples drawn around G (|G|² = sqr_true)."""
    g = np.full(dim, math.sqrt(sqr_true / dim))
    locals_ = g + rng.normal(0, math.sqrt(var_true / dim / micro), (count, dim))
    small = float(np.mean(np.sum(locals_**2, 1)))
    big = float(np.sum(locals_.mean(0) ** 2))
    return NoiseSample(small, big, micro, count)


def test_unbiased_estimates_average_to_the_truth():
    rng = np.random.default_rng(0)
    draws = np.array([unbiased(_sample(rng, 2.0, 30.0, 50, 8, 4)) for _ in range(3000)])
    sqr, var = draws.mean(0)
    assert sqr == pytest.approx(2.0, rel=0.05)
    assert var == pytest.approx(30.0, rel=0.05)


def test_smoothed_noise_scale_converges_and_one_gradient_is_skipped():
    rng = np.random.default_rng(1)
    est = NoiseEstimate(smoothing=0.99)
    assert not est.ready
    for _ in range(1500):
        est = est.update(_sample(rng, 1.0, 64.0, 40, 4, 8))
    assert est.noise_scale == pytest.approx(64.0, rel=0.15)
    assert est.update(NoiseSample(1.0, 1.0, 4, 1)) == est


def test_gain_rules_and_progress():
    sqr, var = 1.0, 100.0  # tr(Σ) per sample: B_simple = 100
    assert lr_factor(LRRule.ADASCALE, 32, 32, sqr, var) == pytest.approx(1.0)
    # McCandlish et al. 2018 eq. 2.11 / Pollux eq. 6: E = (B + M0) / (B + M), r = S·E
    r = 4 * (100 + 32) / (100 + 128)
    assert r == pytest.approx((var / 32 + sqr) / (var / 128 + sqr))  # AdaScale, var at M0
    assert lr_factor(LRRule.ADASCALE, 128, 32, sqr, var) == pytest.approx(r)
    assert lr_factor(LRRule.POLLUX, 128, 32, sqr, var) == pytest.approx(math.sqrt(r))
    assert lr_factor(LRRule.SQRT, 128, 32, sqr, var) == pytest.approx(2.0)
    assert progress_step(128, 32, sqr, var) == pytest.approx(r)
    assert efficiency(128, 32, sqr, var) == pytest.approx(r / 4)
    # no noise: a batch 4x as big makes no more progress than M0 (efficiency 1/4); all
    # noise: 4x the progress (efficiency 1)
    assert efficiency(128, 32, 1.0, 0.0) == pytest.approx(0.25)
    assert efficiency(128, 32, 0.0 + 1e-30, 1.0) == pytest.approx(1.0)


def _observations(model, replicas=2):
    return [
        Observation(1, replicas, m, float(model.iter_time(1, replicas, m)), 0.0)
        for m in (4, 8, 16, 32, 64)
    ]


def test_chooser_picks_big_batches_when_noise_is_high_and_small_when_low():
    truth = ThroughputModel(alpha_c=0.05, beta_c=0.001, alpha_l=0.02)
    obs = _observations(truth)
    common = dict(init_batch=16, max_batch=1024, replicas=2, max_local=256)
    noisy = choose(obs, NoiseEstimate(1.0, sqr_avg=1.0, var_avg=1e4, weight=1.0), **common)
    quiet = choose(obs, NoiseEstimate(1.0, sqr_avg=1.0, var_avg=1.0, weight=1.0), **common)
    assert noisy.global_batch > 4 * quiet.global_batch
    assert 16 <= quiet.global_batch <= noisy.global_batch <= 1024
    assert noisy.global_batch == 2 * noisy.local_batch * noisy.accum_steps
    assert fit_error(ThroughputModel(0.05, 0.001), _observations(truth, 1)) < 0.05


def test_chooser_keeps_the_batch_pinned_by_the_bound():
    truth = ThroughputModel(alpha_c=0.05, beta_c=0.001)
    pick = choose(
        _observations(truth, 1),
        NoiseEstimate(1.0, 1.0, 1e6, 1.0),
        init_batch=8,
        max_batch=8,
        replicas=1,
        max_local=64,
    )
    assert pick.global_batch == 8 and pick.efficiency == pytest.approx(1.0)


def test_squared_norm_with_preconditioner_and_mean_loss_check():
    g = [torch.tensor([3.0, 4.0]), None]
    assert squared_norm(g) == 25.0
    assert squared_norm(g, [torch.tensor([1.0, 0.5]), None]) == 17.0
    out, tgt = torch.randn(4, 3), torch.randint(0, 3, (4,))
    check_mean_loss(torch.nn.functional.cross_entropy, out, tgt)
    with pytest.raises(ConfigError, match="loss that is a mean over samples"):
        check_mean_loss(
            lambda o, t: torch.nn.functional.cross_entropy(o, t, reduction="sum"), out, tgt
        )


def test_throughput_fit_weighs_each_shape_by_its_mean_step_time():
    seen = [Observation(1, 2, 4, t, 0.0) for t in (0.010, 0.010, 0.010, 0.010, 0.050)]
    seen += [Observation(1, 2, 64, 0.040, 0.0)]
    shapes = {o.local_bsz: o.step_time for o in per_shape(seen)}
    assert shapes == {4: pytest.approx(0.018), 64: pytest.approx(0.040)}
    # flat step times and a noisy gradient: the pick doubles the batch exactly (every
    # per-GPU batch is a candidate, not only a coarse grid's)
    flat = [Observation(1, 2, m, 0.01, 0.0) for m in (4, 8)]
    noise = NoiseEstimate(1.0, sqr_avg=1.0, var_avg=1e4, weight=1.0)
    pick = choose(flat, noise, init_batch=16, max_batch=40, replicas=2, max_local=100)
    assert pick.global_batch == 40


def test_fit_reads_the_compute_off_steps_with_two_accumulation_counts():
    """Four workers, sync unreported: the same per-GPU batch timed with one and with three
    micro-batches gives T_grad (each further micro-batch repeats the compute, not the
    sync), so a bigger batch by accumulation is priced right; from one count alone the
    sync would be taken for compute and repeated."""
    truth = ThroughputModel(alpha_c=0.02, beta_c=0.001, alpha_l=0.3)
    seen = [Observation(1, 4, 12, float(truth.iter_time(1, 4, 12, s)), 0.0, s) for s in (0, 2)]
    model = fit(seen)
    assert model.iter_time(1, 4, 12, 1) == pytest.approx(truth.iter_time(1, 4, 12, 1), rel=1e-6)
    blind = fit(seen[:1])
    assert blind.iter_time(1, 4, 12, 1) > 1.5 * truth.iter_time(1, 4, 12, 1)


def test_a_timed_shape_is_judged_by_its_measured_time_not_the_line():
    """Step times that bend upward (memory-bound: 1.12 s at 40 samples, 2.54 s at 80, as
    the deepspeech2 trace on one GPU): the line through the shapes seen puts 40 too slow
    and picks 80; the measured time at 40 wins."""
    seen = [Observation(1, 1, m, t, 0.0) for m, t in ((20, 0.68), (40, 1.12), (80, 2.54))]
    noise = NoiseEstimate(1.0, sqr_avg=1.0, var_avg=20 * 400.0, weight=1.0)  # B_simple 400
    pick = choose(seen, noise, init_batch=20, max_batch=80, replicas=1, max_local=80)
    assert pick.global_batch == 40 and pick.step_time == pytest.approx(1.12)


def test_the_noise_averages_span_samples_not_steps():
    """AdaptDL's weighting (theta = smoothing ** scale): with ``per_samples`` = M0, a step
    of 4 x M0 samples keeps smoothing**4 of the past, a step of M0/4 its fourth root;
    without it, every step keeps ``smoothing``."""
    first = NoiseSample(small_sq=2.0, big_sq=1.5, small_batch=8, count=4)
    second = NoiseSample(small_sq=4.0, big_sq=2.5, small_batch=2, count=4)
    per_step = NoiseEstimate(smoothing=0.9).update(first)
    per_m0 = NoiseEstimate(smoothing=0.9, per_samples=32).update(first)
    assert per_m0 == replace(per_step, per_samples=32)  # 32 samples: one M0
    small = per_m0.update(second)  # 8 samples: a quarter of M0
    sqr, var = unbiased(second)
    theta = 0.9**0.25
    assert small.sqr_avg == pytest.approx(theta * per_m0.sqr_avg + (1 - theta) * sqr)
    assert small.var_avg == pytest.approx(theta * per_m0.var_avg + (1 - theta) * var)
    assert small.weight == pytest.approx(theta * per_m0.weight + (1 - theta))
    assert per_step.update(second).weight == pytest.approx(0.9 * per_step.weight + 0.1)
