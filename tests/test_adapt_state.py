"""The adaptive run's state (pure), the data by sample position, and its metrics and
picture (no Ray)."""

from __future__ import annotations

import dataclasses
import json
import types

import pytest
import torch
from png_checks import check_png

from unipar.adapt import AdaptiveBatch
from unipar.adapt.config import LRRule
from unipar.adapt.lr import progress_step
from unipar.adapt.noise import NoiseSample
from unipar.adapt.state import SETTLE, AdaptState, AdaptStats, BatchShape
from unipar.data.sampler import GlobalBatchSampler, SampleStream
from unipar.errors import ConfigError
from unipar.optimizer import OptimizerSpec
from unipar.plan import Plan
from unipar.runtime.adaptive import AdaptiveStep
from unipar.runtime.metrics import MetricsWriter, StepMetrics, read_metrics
from unipar.testing import tiny_gpt_job
from unipar.viz.run_report import report_run, run_series


def test_sample_stream_is_the_global_batch_order_and_crosses_epochs():
    stream, sampler = SampleStream(40, 3), GlobalBatchSampler(40, 8, 3)
    for step in range(12):  # three epochs of five batches
        assert torch.equal(stream.indices(8 * step, 8), sampler.global_indices(step))
    crossing = stream.indices(36, 8)  # four of epoch 0's end, four of epoch 1's start
    assert torch.equal(crossing[:4], sampler.permutation(0)[36:])
    assert torch.equal(crossing[4:], sampler.permutation(1)[:4])


def _noisy(state: AdaptState, steps: int, seconds: float = 0.1) -> AdaptState:
    """Steps with |G|² = 1, tr(Σ) = 1000 per sample: per-replica norms 1 + 1000/b."""
    for _ in range(steps):
        b = state.shape.per_replica
        k = state.shape.replicas
        sample = NoiseSample(1 + 1000 / b, 1 + 1000 / (b * k), b, k)
        timed = (state.shape, seconds * (1 + 0.01 * state.shape.micro))
        state = state.after_step(sample, timed)
    return state


def test_steps_move_position_and_progress_and_a_choice_grows_a_noisy_batch():
    adaptive = AdaptiveBatch(max_global_batch=256, adapt_every=5)
    state = AdaptState.start(adaptive, 16, BatchShape(micro=4, accum=2, replicas=2))
    state = _noisy(state, 5)
    assert state.samples == 5 * 16
    assert state.progress == pytest.approx(5.0)  # at M0 the gain is 1
    assert state.noise.noise_scale == pytest.approx(1000, rel=1e-6)
    state, pick = state.choose(adaptive, max_micro=64)
    assert 16 < pick.global_batch <= 256 and state.shape.global_batch == pick.global_batch
    stats = state.stats(LRRule.ADASCALE)
    s = pick.global_batch / 16
    # AdaScale's gain with the variance of a batch-M0 gradient, tr(Σ)/16
    assert stats.lr_factor == pytest.approx((1000 / 16 + 1) / (1000 / (16 * s) + 1))
    assert stats.efficiency == pytest.approx(stats.lr_factor / s)
    before = state.progress
    assert state.after_step(None).progress == pytest.approx(before + stats.lr_factor)
    assert AdaptState.from_dict(json.loads(json.dumps(state.to_dict()))) == state


def test_a_resize_keeps_the_global_batch():
    state = AdaptState.start(AdaptiveBatch(64), 24, BatchShape(micro=4, accum=3, replicas=2))
    moved = state.on_replicas(3, max_micro=8)
    assert moved.shape.replicas == 3 and moved.shape.global_batch == 24
    assert moved.shape.micro <= 8


def test_metrics_and_report_carry_the_adaptive_curves(tmp_path):
    writer = MetricsWriter(tmp_path / "metrics.jsonl")
    for step in range(6):
        batch = 8 if step < 3 else 32
        adapt = AdaptStats(batch, 100.0 + step, 1.0 - 0.01 * step, 2.0 * step, 1.0, step, None)
        writer.write(
            StepMetrics(
                step,
                4.0 - 0.1 * step,
                1e-3,
                batch,
                batch * 16,
                0.1,
                batch * 160.0,
                0,
                float(step),
                adapt=adapt,
            )
        )
    writer.close()
    assert read_metrics(tmp_path / "metrics.jsonl")[4]["adapt"]["global_batch"] == 32
    series = run_series(tmp_path)
    assert series.adapt["global_batch"] == (8, 8, 8, 32, 32, 32)
    assert series.samples[-1] == 3 * 8 + 3 * 32
    assert set(series.adapt) == {"global_batch", "noise_scale", "efficiency", "goodput"}
    check_png(report_run(tmp_path))


def test_choices_come_soon_while_the_batch_moves_and_every_k_steps_once_it_holds():
    adaptive = AdaptiveBatch(max_global_batch=64, adapt_every=8)
    state = AdaptState.start(adaptive, 8, BatchShape(micro=4, accum=1, replicas=2))
    state = _noisy(state, SETTLE - 1)
    assert not state.due(adaptive)
    state = _noisy(state, 1)
    assert state.due(adaptive)  # the first choice: SETTLE steps in, not adapt_every
    state, pick = state.choose(adaptive, max_micro=32)
    assert pick.global_batch == 16  # flat step times, noisy gradient: doubled (GROWTH)
    assert state.moving and not state.due(adaptive)
    state = _noisy(state, SETTLE)
    state, pick = state.choose(adaptive, max_micro=32)
    assert pick.global_batch == 32
    held = AdaptiveBatch(max_global_batch=32, adapt_every=8)
    state, pick = _noisy(state, SETTLE).choose(held, max_micro=32)
    assert pick.global_batch == 32 and not state.moving  # kept: the next in adapt_every
    state = _noisy(state, SETTLE)
    assert not state.due(held)
    assert _noisy(state, 8 - SETTLE).due(held)


def test_choices_wait_for_a_positive_gradient_estimate():
    adaptive = AdaptiveBatch(max_global_batch=64, adapt_every=8)
    state = AdaptState.start(adaptive, 8, BatchShape(micro=4, accum=1, replicas=2))
    for _ in range(2 * SETTLE):  # the mean's norm below half the local one: |G|² < 0
        state = state.after_step(NoiseSample(4.0, 1.0, 4, 2), (state.shape, 0.1))
    assert state.noise.ready and not state.due(adaptive)


def test_a_batch_may_shrink_below_m0_to_its_bound_with_less_progress_per_step():
    """A gradient with little noise and step times proportional to the batch: the
    smaller batch makes nearly as much progress per step in a fraction of the time."""
    adaptive = AdaptiveBatch(max_global_batch=64, min_global_batch=8, adapt_every=5)
    state = AdaptState.start(adaptive, 32, BatchShape(micro=16, accum=1, replicas=2))
    picks = []
    for _ in range(3):
        for _ in range(SETTLE):
            b, k = state.shape.per_replica, state.shape.replicas
            sample = NoiseSample(1 + 1 / b, 1 + 1 / (b * k), b, k)  # tr(Σ) = 1: B_simple 1
            state = state.after_step(sample, (state.shape, 0.001 * state.shape.micro))
        state, pick = state.choose(adaptive, max_micro=32)
        picks.append(pick.global_batch)
    assert picks == [16, 8, 8]  # halved at most per choice, down to the bound
    stats = state.stats(LRRule.ADASCALE)
    r = (1 / 32 + 1) / (1 / 8 + 1)  # AdaScale's gain at S = 1/4, below 1
    assert stats.lr_factor == pytest.approx(r) and stats.efficiency == pytest.approx(4 * r)
    before = state.progress
    assert state.after_step(None).progress == pytest.approx(before + r)


def test_one_timed_size_is_probed_before_the_fit_steers_the_batch():
    """Steps of almost only fixed cost, noise scale B_simple = M0: from one timed size,
    the fit's even split of fixed and per-sample time sees no gain in a bigger batch and
    would hold M0; a probe at twice the batch shows the cost barely grows, and the next
    choice grows the batch."""
    adaptive = AdaptiveBatch(max_global_batch=256, adapt_every=5)
    state = AdaptState.start(adaptive, 32, BatchShape(micro=16, accum=1, replicas=2))

    def steps(state: AdaptState) -> AdaptState:
        for _ in range(SETTLE):
            b, k = state.shape.per_replica, state.shape.replicas
            sample = NoiseSample(1 + 32 / b, 1 + 32 / (b * k), b, k)
            state = state.after_step(sample, (state.shape, 0.01 + 1e-5 * state.shape.micro))
        return state

    state, pick = steps(state).choose(adaptive, max_micro=128)
    assert pick.global_batch == 32  # the model alone holds M0
    assert state.shape.global_batch == 64 and state.moving  # the probe
    state, pick = steps(state).choose(adaptive, max_micro=128)
    assert pick.global_batch == 128 and state.shape.global_batch == 128


def test_a_batch_at_the_micro_batch_bound_probes_one_accumulation_step():
    """Four workers at their micro-batch bound (12 each, M0 = 12), steps mostly sync: with
    no accumulated step timed, the fit would count the sync once per micro-batch and never
    accumulate; the probe times 2 micro-batches, after which the batch grows by
    accumulation (the bert trace on 4 and 16 GPUs)."""
    adaptive = AdaptiveBatch(max_global_batch=384, adapt_every=5, max_local_batch=12)
    state = AdaptState.start(adaptive, 12, BatchShape(micro=3, accum=1, replicas=4))

    def seconds(shape: BatchShape) -> float:  # compute 0.1 + 0.01/sample, sync 1.0
        t_grad = 0.1 + 0.01 * shape.micro
        return t_grad * (shape.accum - 1) + t_grad + 1.0

    for _ in range(20):
        b, k = state.shape.per_replica, state.shape.replicas
        for _ in range(SETTLE):
            sample = NoiseSample(1 + 2000 / b, 1 + 2000 / (b * k), b, k)
            state = state.after_step(sample, (state.shape, seconds(state.shape)))
        state, _ = state.choose(adaptive, max_micro=12)
    assert state.shape.micro == 12 and state.shape.accum > 1
    assert any(o.accum > 0 for o in state.observations)


def test_equal_bounds_hold_a_batch_other_than_m0_under_the_rule_from_m0():
    """A fixed batch under the same rules as the adaptive one (the benchmark's sweep):
    bounds 8..8 on a job written for 32 are accepted, the run starts and stays at 8,
    and its learning rate and progress follow from M0 = 32 (AdaScale: gain < 1)."""
    job = dataclasses.replace(
        tiny_gpt_job(global_batch_size=32), optimizer=OptimizerSpec(kind="sgd", lr=0.1),
        adaptive=AdaptiveBatch(max_global_batch=8, min_global_batch=8),
    )
    with pytest.raises(ConfigError, match="or hold the batch at one size"):
        dataclasses.replace(job, adaptive=AdaptiveBatch(max_global_batch=8, min_global_batch=4))
    model = types.SimpleNamespace(parts=[torch.nn.Linear(2, 2)], data_replica=0)
    step = AdaptiveStep(job, Plan.data_parallel(1, 32), model=model, dataset_size=64, state=None)
    assert step.fixed and step.state.shape.global_batch == 8 and step.state.init_batch == 32
    for _ in range(3):  # |G|² = 1, tr(Σ) = 1000 per sample, two gradients of 8
        step.state = step.state.after_step(NoiseSample(1 + 1000 / 8, 1 + 1000 / 16, 8, 2))
    r = progress_step(8, 32, step.state.noise.sqr, step.state.noise.var)
    assert r < 1 and step.lr_factor() == pytest.approx(r)
