"""A job's own step, ``Job(step=fn)`` called as ``fn(model, batch, ctx)``: two losses
summed, one of them over the whole global batch through a collective on the run's data
parallel group (``ctx.data_group``), trains to the single-process losses under ddp and
fsdp. The single-process reference computes the same two losses plainly, on the whole
batch at once, with no collective and no unipar code.

Tolerance as the other parity tests: relative 1e-5 per step's loss (float32 sums in
another order). Each replica computes its step on one micro-batch: the second loss
reads the whole global batch, which gradient accumulation over micro-batches would
not see at once.
"""

from __future__ import annotations

import sys
from dataclasses import replace

import pytest
import ray
import torch
import user_models
from plans_for_tests import planned
from reference_loop import single_process_losses
from torch.nn import functional as F

from unipar import Plan, fit

ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])
ray.cloudpickle.register_pickle_by_value(user_models)

RTOL, SPREAD = 1e-5, 0.1


def two_losses(logits: torch.Tensor, everyone: torch.Tensor, labels: torch.Tensor):  # type: ignore[no-untyped-def]
    """Cross-entropy on this batch plus a penalty on the mean logits of ``everyone``."""
    return F.cross_entropy(logits, labels) + SPREAD * everyone.mean(0).square().sum()


def step(model, batch, ctx):  # type: ignore[no-untyped-def]
    """The user's step: this replica's logits gathered from every data-parallel replica
    (a differentiable all-gather, its backward a reduce-scatter of the gradients)."""
    from torch.distributed.nn.functional import all_gather

    inputs, labels = batch
    logits = model(inputs)
    everyone = torch.cat(all_gather(logits, group=ctx.data_group))
    assert everyone.shape[0] == ctx.plan.global_batch_size  # the whole global batch
    return two_losses(logits, everyone, labels)


def single_process_loss(model, inputs, labels):  # type: ignore[no-untyped-def]
    logits = model(inputs)
    return two_losses(logits, logits, labels)


@pytest.mark.parametrize("axis", ["dp", "fsdp"])
def test_a_custom_step_with_a_collective_matches_single_process(ray_cluster, tmp_path, axis):
    job = replace(user_models.dict_classifier(steps=3), step=step)
    expected, _ = single_process_losses(job, single_process_loss)
    if axis == "dp":
        plan = Plan.data_parallel(2, job.global_batch_size)
    else:
        plan = planned(job, 2, fsdp=2, microbatch_size=job.global_batch_size // 2)
    assert plan.num_microbatches == 1
    # (no checkpoint is read: the one at the end only, not one a step)
    result = fit(job, workers=2, plan=plan, run_dir=tmp_path, progress=False,
                 checkpoint_every=job.steps)
    torch.testing.assert_close(result.losses, expected, rtol=RTOL, atol=0)
    plain, _ = single_process_losses(job, lambda m, x, y: F.cross_entropy(m(x), y))
    assert abs(plain[0] - expected[0]) > 1e-3  # the second loss counts
