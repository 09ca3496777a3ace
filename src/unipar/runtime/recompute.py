"""Activation recompute (Chen et al. 2016; Korthikanti et al. 2022, Sec. 5).

- ``full``: keep only each block's input in forward, run the block's forward again in
  backward; with ``recompute_every = n`` only every n-th block of each part does so and
  the others keep their activations (Megatron-LM's ``--recompute-num-layers``,
  torchtitan's layer-wise selective checkpointing).
- ``selective``: each block keeps the outputs of its matrix multiplications (the
  linear projections, the expensive part) and recomputes everything else: the
  attention core (scores, softmax, dropout, the product with the values), whose
  activations grow with the sequence squared, and the element-wise operations
  (PyTorch's selective activation checkpoint policies, as in torchtitan's op-level
  selective AC).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from unipar.analysis.profile import LayerKind, layer_kind, layer_sequence
from unipar.errors import UnsupportedPlanError
from unipar.plan import Plan, Recompute
from unipar.runtime.stages import set_layer

# Outputs kept under selective recompute: the linear layers' matrix multiplications.
# Batched products (bmm, the attention core) and fused attention are recomputed.
_SAVED_OPS = frozenset(
    {torch.ops.aten.mm.default, torch.ops.aten.addmm.default, torch.ops.aten.linear.default}
)


def apply_recompute(model: nn.Module, plan: Plan) -> nn.Module:
    """Wrap the blocks of ``model`` (whole model or a stage) in PyTorch's checkpoint
    wrapper as the plan asks (see module doc). Parameter names stay the same in state
    dicts: ``torch.distributed.checkpoint`` drops the wrapper's prefix."""
    if plan.recompute is Recompute.NONE:
        return model
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper

    layers = layer_sequence(model)
    blocks = [
        name
        for index, (name, layer) in enumerate(layers)
        if layer_kind(layer, index, len(layers)) is LayerKind.BLOCK
    ]
    if not blocks and layers:
        raise UnsupportedPlanError(
            f"recompute wraps each block of the model, but {type(model).__name__} has no "
            "block (a layer with sub-layers); use recompute=none"
        )
    if plan.recompute is Recompute.SELECTIVE:
        options: dict[str, Any] = {"context_fn": _selective_contexts}
        chosen = blocks
    else:
        options, chosen = {}, blocks[:: plan.recompute_every]
    for name in chosen:
        set_layer(model, name, checkpoint_wrapper(model.get_submodule(name), **options))
    return model


def _save_matmuls(_ctx: Any, op: Callable, *_args: Any, **_kwargs: Any) -> Any:
    from torch.utils.checkpoint import CheckpointPolicy

    return CheckpointPolicy.MUST_SAVE if op in _SAVED_OPS else CheckpointPolicy.PREFER_RECOMPUTE


def _selective_contexts() -> Any:
    from torch.utils.checkpoint import create_selective_checkpoint_contexts

    return create_selective_checkpoint_contexts(_save_matmuls)
