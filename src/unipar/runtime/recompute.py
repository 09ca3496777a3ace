"""Activation recompute: keep only each block's input in forward, recompute the rest in
backward (Chen et al. 2016; "full" recompute in Korthikanti et al. 2022, Sec. 5)."""

from __future__ import annotations

from torch import nn

from unipar.analysis.profile import LayerKind, layer_kind, layer_sequence
from unipar.errors import UnsupportedPlanError
from unipar.plan import Plan, Recompute
from unipar.runtime.stages import set_layer


def apply_recompute(model: nn.Module, plan: Plan) -> nn.Module:
    """Wrap every block of ``model`` (whole model or a stage) in PyTorch's checkpoint
    wrapper when the plan asks for full recompute. Parameter names stay the same in
    state dicts: ``torch.distributed.checkpoint`` drops the wrapper's prefix."""
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
    for name in blocks:
        set_layer(model, name, checkpoint_wrapper(model.get_submodule(name)))
    return model
