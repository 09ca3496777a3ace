"""Data parallelism over the plan's ``dp`` and ``fsdp`` mesh axes.

- ``fsdp > 1``, or any data parallelism combined with tensor or pipeline parallelism: FSDP2
  ``fully_shard``, each block its own group, then the whole model (torchtitan's
  layout). Over ``fsdp`` alone it is ZeRO-3, or ZeRO-2-like with
  ``reshard_after_forward=False`` (Rajbhandari et al. 2020); with ``dp`` as well it is
  hybrid sharding (HSDP): sharded within ``fsdp``, replicated across ``dp``.
  Parameters tied across layers (a word embedding and the output head) must be in one
  FSDP group: a block holding a parameter tied to a layer outside it is not its own
  group but part of the whole model's.
- ``dp`` alone: PyTorch DDP, gradients all-reduced in buckets during backward
  (Li et al. 2020).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from unipar.analysis.profile import LayerKind, layer_kind, layer_sequence
from unipar.plan import Plan
from unipar.runtime.parallel.stages import tied_parameters


def uses_fully_shard(plan: Plan) -> bool:
    """FSDP2 unless the plan is pure data parallel (DDP) or has no data axis at all.
    Pipeline stages take FSDP2 even for plain replication: DDP's bucket rebuilding
    breaks when a schedule runs several forwards before the first backward."""
    mesh = plan.mesh
    return mesh.data_replicas > 1 and (mesh.fsdp > 1 or mesh.tp > 1 or mesh.pp > 1)


def apply_fully_shard(model: nn.Module, plan: Plan, device_mesh: Any) -> nn.Module:
    """Shard ``model`` (whole model or a stage, typically still on the meta device) over
    the plan's data axes of ``device_mesh``."""
    from torch.distributed.fsdp import fully_shard  # noqa: PLC0415 (heavy: torch.distributed.fsdp)

    mesh = plan.mesh
    # 2D with dp: replicated over dp, sharded over fsdp.
    data_mesh = device_mesh["dp", "fsdp"] if mesh.dp > 1 else device_mesh["fsdp"]
    layers = layer_sequence(model)
    tied = tied_parameters(model)
    for index, (name, layer) in enumerate(layers):
        is_block = layer_kind(layer, index, len(layers)) is LayerKind.BLOCK
        if is_block and not _tied_outside(name, tied):
            fully_shard(layer, mesh=data_mesh, reshard_after_forward=plan.reshard_after_forward)
    fully_shard(model, mesh=data_mesh, reshard_after_forward=plan.reshard_after_forward)
    return model


def _tied_outside(layer_name: str, tied: list[list[str]]) -> bool:
    """Whether the layer holds a parameter tied to one outside it."""
    prefix = f"{layer_name}."
    return any(
        any(n.startswith(prefix) for n in names) and not all(n.startswith(prefix) for n in names)
        for names in tied
    )


def apply_ddp(model: nn.Module, device: torch.device) -> nn.Module:
    """Wrap a materialised ``model`` in DDP over all ranks."""
    device_ids = [device.index] if device.type == "cuda" else None
    return DistributedDataParallel(model, device_ids=device_ids)
