"""Gradient clipping by the global norm over every shard and pipeline stage."""

from __future__ import annotations

from collections import defaultdict
from typing import Any

import torch
import torch.distributed as dist
from torch import nn


@torch.no_grad()
def clip_grad_norm(
    parameters: list[nn.Parameter], max_norm: float, pp_group: Any = None
) -> torch.Tensor:
    """Scale gradients so their global 2-norm is at most ``max_norm``; return the norm.

    Gradients may be plain tensors or DTensors on different meshes (tensor-parallel
    layers, replicated layers, FSDP shards): each group's squared norm is reduced over
    its own mesh, then over the pipeline stages (torchtitan's ``clip_grad_norm_``)."""
    from torch.distributed.tensor import DTensor  # noqa: PLC0415 (heavy: torch.distributed.tensor)

    groups: dict[Any, list[torch.Tensor]] = defaultdict(list)
    for param in parameters:
        if param.grad is not None:
            grad = param.grad
            key = (grad.device_mesh, grad.placements) if isinstance(grad, DTensor) else None
            groups[key].append(grad)
    squared = torch.zeros(())
    for grads in groups.values():
        norm = torch.nn.utils.get_total_norm(grads, 2.0)
        if isinstance(norm, DTensor):
            norm = norm.full_tensor()
        squared = squared.to(norm.device) + norm**2
    if pp_group is not None:
        dist.all_reduce(squared, group=pp_group)
    total = squared.sqrt()
    coefficient = min(1.0, max_norm / (total.item() + 1e-6))  # as clip_grad_norm_
    if coefficient < 1.0:
        for grads in groups.values():
            torch._foreach_mul_(grads, coefficient)
    return total
