"""Give a model built on the meta device and then parallelised its real weights: exactly
those of the single-device model built with the same seed."""

from __future__ import annotations

import torch
from torch import nn

_WRAPPER_MODULE = "_checkpoint_wrapped_module"  # what recompute's wrapper inserts


def clean_name(name: str) -> str:
    """A parameter or buffer name without the parts recompute's wrapper inserts (whole
    name parts only: a user's ``my_module.scale`` stays as it is)."""
    return ".".join(part for part in name.split(".") if part != _WRAPPER_MODULE)


@torch.no_grad()
def load_reference_weights(
    part: nn.Module, reference: nn.Module, device: torch.device
) -> nn.Module:
    """Allocate ``part`` (a parallelised model or stage on the meta device) on ``device``
    and copy in the matching tensors of ``reference`` (the whole model, built on CPU).

    Parameters go through ``set_model_state_dict`` with full tensors, which slices each
    into this rank's shard of its DTensor (FSDP and tensor parallel); buffers, persistent
    or not, are copied whole."""
    from torch.distributed.checkpoint.state_dict import (  # noqa: PLC0415 (heavy: torch.distributed.checkpoint)
        StateDictOptions,
        get_model_state_dict,
        set_model_state_dict,
    )

    part.to_empty(device=device)
    full = reference.state_dict()
    wanted = get_model_state_dict(part).keys()
    set_model_state_dict(
        part,
        {name: full[name] for name in wanted},
        options=StateDictOptions(full_state_dict=True),
    )
    reference_buffers = dict(reference.named_buffers())
    for name, buffer in part.named_buffers():
        buffer.copy_(reference_buffers[clean_name(name)])
    return part
