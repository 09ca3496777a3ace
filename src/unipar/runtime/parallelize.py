"""Apply a plan's parallelism to a freshly built model on one worker."""

from __future__ import annotations

import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from unipar.errors import UnsupportedPlanError
from unipar.plan import Plan


def parallelize(
    model: nn.Module, plan: Plan, *, device: torch.device, world_size: int
) -> nn.Module:
    """Wrap ``model`` as ``plan`` says; the result is what the train loop calls."""
    mesh = plan.mesh
    if mesh.world_size != world_size:
        raise UnsupportedPlanError(
            f"the plan's mesh needs {mesh.world_size} workers (pp={mesh.pp} x dp={mesh.dp} x "
            f"fsdp={mesh.fsdp} x tp={mesh.tp}), but the run has {world_size}; set workers="
            f"{mesh.world_size} or choose a plan for {world_size}"
        )
    if (mesh.pp, mesh.fsdp, mesh.tp) != (1, 1, 1):
        raise UnsupportedPlanError(
            f"this runtime applies data parallel plans only, but the plan has pp={mesh.pp}, "
            f"fsdp={mesh.fsdp}, tp={mesh.tp}; use a plan with only the dp axis"
        )
    model.to(device)
    if world_size == 1:
        return model
    device_ids = [device.index] if device.type == "cuda" else None
    return DistributedDataParallel(model, device_ids=device_ids)
