"""Parity with the adaptive batch on: the batch pinned by its bound (max_global_batch ==
M0), every plan trains to the single-process losses, and the gradient norms it measured
are those of the replicas' (or first micro-batch's) gradients computed here in one process.

Tolerances, float32: relative 1e-5 per step's loss, as tests/test_parity_plans.py (the
adaptive machinery adds hooks and one all-reduce of three numbers, no arithmetic on the
gradients). The first step's unbiased |G|² and tr(Σ) (McCandlish et al. 2018, App. A.1):
relative 1e-3 against float64 sums of this process's float32 gradients (the runtime sums
squares of flat buffers in another order; measured: 2e-6 on |G|², a difference of
nearly equal numbers, 1e-8 on tr(Σ)). Under tensor parallelism
a parameter replicated over the tp ranks counts once per rank in both norms (see
:mod:`unipar.runtime.adaptive`): the check there is the losses and a finite estimate.
"""

from __future__ import annotations

import math
import sys
from dataclasses import replace

import pytest
import ray
import torch
from plans_for_tests import planned
from reference_loop import single_process_losses

from unipar import Job, Plan, fit
from unipar.adapt import AdaptiveBatch
from unipar.adapt.noise import NoiseSample, unbiased
from unipar.data.sampler import GlobalBatchSampler
from unipar.testing import tiny_gpt_job

ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])

RTOL = 1e-5
NORM_RTOL = 1e-3
STEPS = 6


def _pinned(job: Job) -> Job:
    return replace(job, adaptive=AdaptiveBatch(max_global_batch=job.global_batch_size))


def first_step_norms(job: Job, replicas: int, micro: int) -> tuple[float, float]:
    """(|G|², tr(Σ)) of step 0 from per-replica gradients (``replicas`` > 1) or, with one
    replica, the first micro-batch's gradient against the whole batch's."""
    torch.manual_seed(job.seed)
    model = job.model()
    dataset = job.dataset()
    indices = GlobalBatchSampler(len(dataset), job.global_batch_size, job.seed).global_indices(0)

    def grad(part: torch.Tensor) -> torch.Tensor:
        model.zero_grad(set_to_none=True)
        pairs = [dataset[int(i)] for i in part]
        inputs, targets = torch.stack([p[0] for p in pairs]), torch.stack([p[1] for p in pairs])
        job.loss(model(inputs), targets).backward()
        return torch.cat([p.grad.double().flatten() for p in model.parameters()])

    whole = grad(indices)
    if replicas > 1:
        local = [grad(part) for part in indices.chunk(replicas)]
        small = sum(float(g.square().sum()) for g in local) / replicas
        sample = NoiseSample(small, float(whole.square().sum()), len(indices) / replicas, replicas)
    else:
        first = grad(indices[:micro])
        sample = NoiseSample(
            float(first.square().sum()), float(whole.square().sum()), micro, len(indices) // micro
        )
    return unbiased(sample)


CASES = {
    # name: (workers, plan pins or None for DDP, micro-batch, exact norms)
    "ddp2-accumulate": (2, None, 2, True),
    "fsdp2": (2, {"fsdp": 2, "microbatch_size": 2}, 2, True),
    "tp2": (2, {"tp": 2, "microbatch_size": 4}, 4, False),
    "pp2xdp2": (4, {"pp": 2, "dp": 2, "microbatch_size": 2}, 2, True),
}


@pytest.mark.parametrize("case", list(CASES))
def test_adaptive_pinned_batch_matches_single_process(ray_cluster, tmp_path, case):
    workers, pins, micro, exact = CASES[case]
    job = tiny_gpt_job(steps=STEPS, global_batch_size=8)
    expected, _ = single_process_losses(job)
    if pins is None:
        plan = Plan.data_parallel(workers, job.global_batch_size, micro)
    else:
        plan = planned(job, workers, **pins)
    result = fit(_pinned(job), workers=workers, plan=plan, run_dir=tmp_path, progress=False,
                 checkpoint_every=job.steps)  # one checkpoint, not one a step: none is read

    torch.testing.assert_close(result.losses, expected, rtol=RTOL, atol=0)
    stats = [m.adapt for m in result.history]
    assert all(s is not None and s.global_batch == 8 for s in stats)
    assert all(s.lr_factor == 1.0 and s.efficiency == pytest.approx(1.0) for s in stats)
    assert [s.progress for s in stats] == [float(k) for k in range(STEPS)]
    measured = (stats[1].grad_sqr, stats[1].grad_var)
    assert all(math.isfinite(v) for v in measured) and measured[1] > 0
    if exact:
        reference = first_step_norms(job, plan.mesh.data_replicas, micro)
        assert measured == pytest.approx(reference, rel=NORM_RTOL)


def test_an_adaptive_run_checkpoints_every_k_steps_of_m0_in_samples(ray_cluster, tmp_path):
    """Its batch moves (here from 8, between 4 and 32): a checkpoint follows each step that
    reaches a multiple of checkpoint_every × M0 samples, and the last step."""
    job = replace(
        tiny_gpt_job(steps=16, global_batch_size=8),
        adaptive=AdaptiveBatch(max_global_batch=32, min_global_batch=4, adapt_every=2),
    )
    result = fit(
        job,
        workers=2,
        plan=Plan.data_parallel(2, 8),
        run_dir=tmp_path,
        progress=False,
        checkpoint_every=2,
        keep_checkpoints=1000,
    )
    expected, samples = set(), 0
    for m in result.history:
        if (samples + m.adapt.global_batch) // 16 > samples // 16:
            expected.add(m.step + 1)
        samples += m.adapt.global_batch
    expected.add(len(result.history))
    saved = {int(p.name.split("_")[1]) for p in result.checkpoint_dir.glob("step_*")}
    assert saved == expected


def consecutive_norms(job: Job) -> tuple[float, float]:
    """(|G|², tr(Σ)) from the gradients of steps 0 and 1 of a plain loop here, as two
    replicas' (the one-replica estimate with a single micro-batch)."""
    torch.manual_seed(job.seed)
    model = job.model()
    optimizer = job.build_optimizer(model.parameters())
    dataset = job.dataset()
    sampler = GlobalBatchSampler(len(dataset), job.global_batch_size, job.seed)
    grads = []
    for step in range(2):
        pairs = [dataset[int(i)] for i in sampler.global_indices(step)]
        inputs, targets = torch.stack([p[0] for p in pairs]), torch.stack([p[1] for p in pairs])
        job.loss(model(inputs), targets).backward()
        grads.append(torch.cat([p.grad.double().flatten() for p in model.parameters()]))
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    small = (float(grads[0].square().sum()) + float(grads[1].square().sum())) / 2
    big = float(((grads[0] + grads[1]) / 2).square().sum())
    return unbiased(NoiseSample(small, big, job.global_batch_size, 2))


def test_one_replica_with_one_microbatch_measures_two_consecutive_steps(ray_cluster, tmp_path):
    """One worker, the whole batch in one micro-batch: no estimate at step 0, then the
    norms of steps 0 and 1's gradients (AdaptDL's estimator), and the losses unchanged."""
    job = tiny_gpt_job(steps=4, global_batch_size=8)
    expected, _ = single_process_losses(job)
    plan = Plan.data_parallel(1, job.global_batch_size, job.global_batch_size)
    result = fit(_pinned(job), workers=1, plan=plan, run_dir=tmp_path, progress=False,
                 checkpoint_every=job.steps)  # one checkpoint, not one a step: none is read
    torch.testing.assert_close(result.losses, expected, rtol=RTOL, atol=0)
    stats = [m.adapt for m in result.history]
    assert (stats[1].grad_sqr, stats[1].grad_var) == (0.0, 0.0)  # one gradient: no sample
    measured = (stats[2].grad_sqr, stats[2].grad_var)
    assert measured == pytest.approx(consecutive_norms(job), rel=NORM_RTOL)
