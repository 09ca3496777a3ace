"""Data parallelism with uneven shares: replica ``i`` takes ``samples[i]`` samples of each
global batch (a contiguous slice of the same global order every plan uses), in
micro-batches of ``microbatch_size``.

Weighted gradient averaging: each micro-batch's mean loss is scaled by
``microbatch_samples / global_batch_size`` before backward and the gradients are
summed over replicas, so the result is the gradient of the mean loss over the whole
global batch, as uniform training computes it (for a loss that is a per-sample mean).
"""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from unipar.errors import ConfigError


@dataclass(frozen=True)
class UnevenResult:
    losses: list[float]
    state: dict[str, torch.Tensor]
    step_s: list[float]  # rank 0's wall time per step (compute and all-reduce)
    compute_s: list[list[float]]  # per replica, per step: forward+backward time


def check_shares(samples: Sequence[int], global_batch_size: int, microbatch_size: int) -> None:
    if sum(samples) != global_batch_size or any(n < 0 or n % microbatch_size for n in samples):
        raise ConfigError(
            f"uneven data-parallel shares must be multiples of microbatch_size="
            f"{microbatch_size} summing to global_batch_size={global_batch_size}, but got "
            f"{list(samples)}; take them from HeteroPlan.replica_samples"
        )


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class _Replica:
    """One data-parallel replica in its own process (a Ray actor)."""

    def __init__(self, rank: int, world: int, address: str, cpus: list[int] | None) -> None:
        if cpus is not None:
            os.sched_setaffinity(0, cpus)
        torch.set_num_threads(1)
        import torch.distributed as dist

        dist.init_process_group("gloo", init_method=address, rank=rank, world_size=world)
        self.rank = rank

    def train(self, job: Any, samples: list[int], microbatch_size: int) -> dict[str, Any]:
        import torch.distributed as dist

        from unipar.data.batch import collate
        from unipar.data.sampler import GlobalBatchSampler

        torch.manual_seed(job.seed)
        model = job.model()
        optimizer = job.build_optimizer(model.parameters())
        base = [g["lr"] for g in optimizer.param_groups]
        dataset = job.dataset()
        sampler = GlobalBatchSampler(len(dataset), job.global_batch_size, job.seed)
        start = sum(samples[: self.rank])
        mine = samples[self.rank]
        params = [p for p in model.parameters() if p.requires_grad]
        losses, step_s, compute_s = [], [], []
        for step in range(job.steps):
            began = time.perf_counter()
            for group, lr in zip(optimizer.param_groups, base, strict=True):
                group["lr"] = lr * job.lr_schedule.multiplier(step, job.steps)
            indices = sampler.global_indices(step)[start : start + mine]
            loss_sum = torch.zeros(())
            for first in range(0, mine, microbatch_size):
                batch = [dataset[int(i)] for i in indices[first : first + microbatch_size]]
                inputs, targets = collate(batch, job.collate)
                weight = len(batch) / job.global_batch_size
                loss = job.loss(job.call(model, inputs), targets) * weight
                loss.backward()
                loss_sum += loss.detach()
            for p in params:
                if p.grad is None:
                    p.grad = torch.zeros_like(p)
            computed = time.perf_counter() - began
            flat = torch.cat([p.grad.reshape(-1) for p in params] + [loss_sum.reshape(1)])
            dist.all_reduce(flat)
            offset = 0
            for p in params:
                p.grad.copy_(flat[offset : offset + p.numel()].view_as(p))
                offset += p.numel()
            if job.grad_clip_norm is not None:
                torch.nn.utils.clip_grad_norm_(params, job.grad_clip_norm)
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            losses.append(flat[-1].item())
            step_s.append(time.perf_counter() - began)
            compute_s.append(computed)
        dist.destroy_process_group()
        state = model.state_dict() if self.rank == 0 else {}
        return {"losses": losses, "state": state, "step_s": step_s, "compute_s": compute_s}


def train_uneven(
    job: Any,
    samples: Sequence[int],
    microbatch_size: int,
    *,
    cpus: Sequence[list[int]] | None = None,
    num_cpus_per_replica: float = 1.0,
) -> UnevenResult:
    """Train ``job`` on ``len(samples)`` Ray actors with those per-replica shares;
    ``cpus``: each replica's CPU cores (``os.sched_setaffinity``), e.g. to make replicas
    of different speed on one machine. All replicas on this node (gloo over loopback)."""
    import ray

    samples = list(samples)
    check_shares(samples, job.global_batch_size, microbatch_size)
    address = f"tcp://127.0.0.1:{_free_port()}"
    actor = ray.remote(num_cpus=num_cpus_per_replica)(_Replica)
    world = len(samples)
    replicas = [
        actor.remote(rank, world, address, list(cpus[rank]) if cpus else None)
        for rank in range(world)
    ]
    try:
        out = ray.get([r.train.remote(job, samples, microbatch_size) for r in replicas])
    finally:
        for r in replicas:
            ray.kill(r)
    return UnevenResult(
        losses=out[0]["losses"],
        state=out[0]["state"],
        step_s=out[0]["step_s"],
        compute_s=[o["compute_s"] for o in out],
    )
