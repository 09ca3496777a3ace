"""ZeRO-1, the distributed optimizer (Rajbhandari et al. 2020, stage 1; Megatron-LM's
``--use-distributed-optimizer``): gradients are all-reduced as under plain DDP, but each
data-parallel rank keeps optimizer state for, and updates, only its own share of the
parameters, then broadcasts them to the other ranks.

Parameters are shared out whole, largest first to the least loaded rank (the
partition of PyTorch's ``ZeroRedundancyOptimizer``). Each rank's optimizer is the job's
own optimizer over its share, so checkpoints (``torch.distributed.checkpoint``, state
keyed by parameter name) save and reshard it like any other; PyTorch's
``ZeroRedundancyOptimizer`` needs its state consolidated on one rank first.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from unipar.errors import UnsupportedPlanError
from unipar.plan import Plan

BuildOptimizer = Callable[[Iterable[nn.Parameter]], torch.optim.Optimizer]


def check_distributed_optimizer(plan: Plan) -> None:
    """The runtime shards optimizer state over plain data parallelism (DDP) only."""
    mesh = plan.mesh
    if plan.distributed_optimizer and (mesh.fsdp, mesh.tp, mesh.pp, mesh.cp) != (1, 1, 1, 1):
        raise UnsupportedPlanError(
            f"the runtime applies a distributed optimizer (ZeRO-1) over plain data "
            f"parallelism only, but the plan has fsdp={mesh.fsdp}, tp={mesh.tp}, "
            f"pp={mesh.pp}, cp={mesh.cp}; set distributed_optimizer to false (fsdp shards "
            "optimizer state with ZeRO-2/3) or use a plan with dp alone"
        )


def owners(params: list[nn.Parameter], ranks: int) -> list[int]:
    """The rank that updates each parameter: largest first to the least loaded."""
    load = [0] * ranks
    owner = [0] * len(params)
    for index in sorted(range(len(params)), key=lambda i: -params[i].numel()):
        rank = min(range(ranks), key=lambda r: (load[r], r))
        owner[index] = rank
        load[rank] += params[index].numel()
    return owner


def build_optimizer(
    build: BuildOptimizer, module: nn.Module, plan: Plan, *, rank: int, world_size: int
) -> torch.optim.Optimizer:
    """The job's optimizer for ``module``: over all its parameters, or under
    ``plan.distributed_optimizer`` over this rank's share (see module doc)."""
    params = [p for p in module.parameters() if p.requires_grad]
    if not plan.distributed_optimizer or world_size == 1:
        return build(module.parameters())
    owner = owners(params, world_size)
    mine = [p for p, o in zip(params, owner, strict=True) if o == rank]
    if not mine:
        raise UnsupportedPlanError(
            f"a distributed optimizer shares {len(params)} parameters out over "
            f"{world_size} ranks, leaving rank {rank} none; use fewer workers or set "
            "distributed_optimizer to false"
        )
    optimizer = build(mine)
    optimizer.register_step_post_hook(_broadcaster(params, owner, rank))
    return optimizer


def _broadcaster(params: list[nn.Parameter], owner: list[int], me: int) -> Callable[..., None]:
    """After each step: every parameter from its owner; the other ranks' parameters'
    gradients dropped (this rank's ``zero_grad`` reaches only its own share)."""

    def broadcast(*_: Any) -> None:
        with torch.no_grad():
            for param, rank in zip(params, owner, strict=True):
                dist.broadcast(param.data, src=rank)
                if rank != me:
                    param.grad = None

    return broadcast
