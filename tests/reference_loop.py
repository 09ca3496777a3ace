"""A plain single-process PyTorch training loop: the baseline parity tests compare to."""

from __future__ import annotations

import torch

from unipar.data.sampler import GlobalBatchSampler
from unipar.job import Job


def single_process_losses(job: Job) -> tuple[list[float], dict[str, torch.Tensor]]:
    """Losses per step and final weights of ``job`` trained in this process on the
    whole global batch at once, with no unipar runtime involved."""
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
        inputs = torch.stack([s[0] for s in samples])
        targets = torch.stack([s[1] for s in samples])
        loss = job.loss(model(inputs), targets)
        loss.backward()
        if job.grad_clip_norm is not None:
            torch.nn.utils.clip_grad_norm_(model.parameters(), job.grad_clip_norm)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        losses.append(loss.item())
    return losses, model.state_dict()
