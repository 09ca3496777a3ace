"""A plain single-process PyTorch training loop: the baseline parity tests compare to."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch.utils.data import default_collate

from unipar.data.sampler import GlobalBatchSampler
from unipar.job import Job


def single_process_losses(
    job: Job, loss_of: Callable[[torch.nn.Module, Any, Any], torch.Tensor] | None = None
) -> tuple[list[float], dict[str, torch.Tensor]]:
    """Losses per step and final weights of ``job`` trained in this process on the
    whole global batch at once, with no unipar runtime involved. ``loss_of(model,
    inputs, targets)``: the step's loss (default: the job's loss of the model's output,
    the model called as the job says)."""
    if loss_of is None:

        def loss_of(model, inputs, targets):  # type: ignore[no-untyped-def]
            outputs = model(**inputs) if job.call.value == "kwargs" else model(inputs)
            return job.loss(outputs, targets)

    torch.manual_seed(job.seed)
    model = job.model()
    optimizer = job.build_optimizer(model.parameters())
    base = [g["lr"] for g in optimizer.param_groups]
    dataset = job.dataset()
    sampler = GlobalBatchSampler(len(dataset), job.global_batch_size, job.seed)
    losses = []
    for step in range(job.steps):
        for group, lr in zip(optimizer.param_groups, base, strict=True):
            group["lr"] = lr * job.lr_schedule.multiplier(step, job.steps)
        samples = [dataset[int(i)] for i in sampler.global_indices(step)]
        inputs, targets = (job.collate or default_collate)(samples)
        loss = loss_of(model, inputs, targets)
        loss.backward()
        if job.grad_clip_norm is not None:
            torch.nn.utils.clip_grad_norm_(model.parameters(), job.grad_clip_norm)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        losses.append(loss.item())
    return losses, model.state_dict()


def assert_trained_like(job: Job, final: dict[str, torch.Tensor], expected: dict[str, torch.Tensor],
                        atol: float, moved: float) -> None:
    """``final`` weights (read back from a run's checkpoint) within ``atol`` of the
    single-process run's ``expected``, and at least ``moved`` away from the initial
    ones somewhere (the optimizer steps really happened)."""
    assert set(final) <= set(expected)
    for name, tensor in final.items():
        torch.testing.assert_close(tensor, expected[name], rtol=0, atol=atol, msg=name)
    torch.manual_seed(job.seed)
    initial = job.model().state_dict()
    assert max((final[k] - initial[k]).abs().max().item() for k in final) > moved
