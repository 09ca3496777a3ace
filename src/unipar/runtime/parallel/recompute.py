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
- ``selective_op``: torchtitan's op-level policy (``torchtitan/models/llama3/infra/
  parallelize.py``, ``_save_list``): each block saves the outputs of its fused
  attention kernel and of every other ``mm`` (the 1st, 3rd, ...), and recomputes the
  other products and every element-wise and norm op.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import nn
from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper
from torch.utils.checkpoint import CheckpointPolicy, create_selective_checkpoint_contexts

from unipar.analysis.profile import LayerKind, layer_kind, layer_sequence
from unipar.errors import UnsupportedPlanError
from unipar.plan import Plan, Recompute
from unipar.runtime.parallel.stages import set_layer

# Outputs kept under selective recompute: the linear layers' matrix multiplications.
# Batched products (bmm, the attention core) and fused attention are recomputed.
_SAVED_OPS = frozenset(
    {torch.ops.aten.mm.default, torch.ops.aten.addmm.default, torch.ops.aten.linear.default}
)
# selective_op: fused attention kernels' outputs are saved too (torchtitan's list).
_ATTENTION_OPS = frozenset(
    getattr(torch.ops.aten, name).default
    for name in (
        "_scaled_dot_product_flash_attention",
        "_scaled_dot_product_efficient_attention",
        "_scaled_dot_product_cudnn_attention",
        "_scaled_dot_product_flash_attention_for_cpu",
    )
    if hasattr(torch.ops.aten, name)
)


def apply_recompute(model: nn.Module, plan: Plan) -> nn.Module:
    """Wrap the blocks of ``model`` (whole model or a stage) in PyTorch's checkpoint
    wrapper as the plan asks (see module doc). Parameter names stay the same in state
    dicts: ``torch.distributed.checkpoint`` drops the wrapper's prefix."""
    if plan.recompute is Recompute.NONE:
        return model
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
    if plan.recompute in (Recompute.SELECTIVE, Recompute.SELECTIVE_OP):
        context = _selective_contexts if plan.recompute is Recompute.SELECTIVE else _op_contexts
        options: dict[str, Any] = {"context_fn": context}
        chosen = blocks
    else:
        options, chosen = {}, blocks[:: plan.recompute_every]
    for name in chosen:
        set_layer(model, name, checkpoint_wrapper(model.get_submodule(name), **options))
    return model


def _save_matmuls(_ctx: Any, op: Callable, *_args: Any, **_kwargs: Any) -> Any:
    return CheckpointPolicy.MUST_SAVE if op in _SAVED_OPS else CheckpointPolicy.PREFER_RECOMPUTE


def _selective_contexts() -> Any:
    return create_selective_checkpoint_contexts(_save_matmuls)


def _op_contexts() -> Any:
    """torchtitan's op-level policy: products counted per block and per pass (forward
    and recompute count apart, so both choose the same products)."""
    products = {False: 0, True: 0}

    def policy(ctx: Any, op: Callable, *_args: Any, **_kwargs: Any) -> Any:
        if op in _SAVED_OPS:
            products[ctx.is_recompute] += 1
            keep = products[ctx.is_recompute] % 2 == 1
        else:
            keep = op in _ATTENTION_OPS
        return CheckpointPolicy.MUST_SAVE if keep else CheckpointPolicy.PREFER_RECOMPUTE

    return create_selective_checkpoint_contexts(policy)
