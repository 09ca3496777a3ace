"""Tensor parallelism with DTensor's ``parallelize_module``, layer by layer as the plan says.

A ``MEGATRON`` layer (a block) has its linear layers split by role (Shoeybi et al. 2019,
Sec. 3): projections into the heads or the MLP's inner width column-wise, the
projections back to the residual width row-wise, so each attention or MLP costs one
all-reduce forward and one backward. Roles are read from the names the common model
families use (``wq``/``q_proj``/``fc``/``w1`` ... in, ``wo``/``o_proj``/``proj``/``w2``
... out). A ``VOCAB`` layer splits an embedding or output projection along the
vocabulary, its output gathered whole. ``REPLICATE`` layers stay whole on every rank.
"""

from __future__ import annotations

from enum import Enum
from typing import Any

from torch import nn

from unipar.analysis.profile import layer_sequence
from unipar.errors import UnsupportedPlanError
from unipar.plan import Plan, TensorParallelStyle

COLUMN_WISE_NAMES = frozenset(
    {"wq", "wk", "wv", "q_proj", "k_proj", "v_proj", "query", "key", "value"}
    | {"fc", "fc1", "c_fc", "w1", "w3", "gate_proj", "up_proj"}
)
ROW_WISE_NAMES = frozenset({"wo", "o_proj", "out_proj", "proj", "fc2", "c_proj", "w2", "down_proj"})
_WITHOUT_TP = "dp, fsdp and pp (plans with tp=1)"


class ShardRole(Enum):
    """How one module splits over the tp axis."""

    COLUMN = "column"  # output features split (into heads or the MLP's inner width)
    ROW = "row"  # input features split (back to the residual width), outputs all-reduced
    VOCAB = "vocab"  # embedding or output projection split along the vocabulary


def block_roles(block_name: str, block: nn.Module, tp: int) -> dict[str, ShardRole]:
    """``{linear layer path inside the block: COLUMN or ROW}``, or a clear error when
    the block cannot be split by role."""
    roles: dict[str, ShardRole] = {}
    unknown: list[str] = []
    for path, module in block.named_modules():
        leaf = path.rpartition(".")[2]
        if isinstance(module, nn.MultiheadAttention):
            raise UnsupportedPlanError(
                f"tensor parallel cannot split layer {block_name!r}: {path} is an "
                "nn.MultiheadAttention, whose query, key and value share one fused weight "
                "(in_proj_weight). Write attention with separate wq, wk, wv, wo nn.Linear "
                f"layers to use tp, or use {_WITHOUT_TP}"
            )
        if not isinstance(module, nn.Linear):
            continue
        if leaf in COLUMN_WISE_NAMES:
            roles[path], width = ShardRole.COLUMN, module.out_features
        elif leaf in ROW_WISE_NAMES:
            roles[path], width = ShardRole.ROW, module.in_features
        else:
            unknown.append(path)
            continue
        if width % tp:
            raise UnsupportedPlanError(
                f"tensor parallel splits {block_name}.{path} into tp={tp} parts along a "
                f"width of {width}, which tp does not divide; choose a tp that divides {width}"
            )
    if unknown or ShardRole.COLUMN not in roles.values() or ShardRole.ROW not in roles.values():
        known = sorted((path, role.value) for path, role in roles.items())
        raise UnsupportedPlanError(
            f"tensor parallel cannot split layer {block_name!r} ({type(block).__name__}): it "
            "splits a block's linear layers by role, column-wise into the heads or inner "
            f"width (names {sorted(COLUMN_WISE_NAMES)}) and row-wise back "
            f"(names {sorted(ROW_WISE_NAMES)}); this block has linear layers "
            f"{sorted(unknown) or 'none'} of unknown role and "
            f"{known or 'no known ones'}. Rename its linear layers by role, "
            f"or use {_WITHOUT_TP}"
        )
    return roles


def _vocab_style(name: str, layer: nn.Module, tp: int) -> Any:
    from torch.distributed.tensor import Replicate
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel

    if isinstance(layer, nn.Embedding):
        rows = layer.num_embeddings
        style = RowwiseParallel(input_layouts=Replicate(), output_layouts=Replicate())
    elif isinstance(layer, nn.Linear):
        rows = layer.out_features
        style = ColwiseParallel(output_layouts=Replicate())
    else:
        raise UnsupportedPlanError(
            f"the plan splits layer {name!r} along the vocabulary, which needs an nn.Embedding "
            f"or nn.Linear, but it is a {type(layer).__name__}; use the planner's styles"
        )
    if rows % tp:
        raise UnsupportedPlanError(
            f"tensor parallel splits layer {name!r} along its {rows} rows into tp={tp} parts, "
            f"which tp does not divide; choose a tp that divides {rows}"
        )
    return style


def tensor_parallel_roles(model: nn.Module, plan: Plan) -> dict[str, ShardRole]:
    """``{module path: its ShardRole}`` for the whole ``model`` under ``plan``,
    or the error that says why a layer cannot be split. Needs no device mesh."""
    tp = plan.mesh.tp
    layers = layer_sequence(model)
    if plan.sequence_parallel:
        raise UnsupportedPlanError(
            "this runtime does not apply sequence parallelism yet; use the plan with "
            "sequence_parallel=false (the planner does not choose it)"
        )
    if len(plan.layer_tp) != len(layers):
        raise UnsupportedPlanError(
            f"a plan with tp={tp} needs a tensor-parallel style for each of the model's "
            f"{len(layers)} layers, but layer_tp has {len(plan.layer_tp)}; plan this model "
            "with the planner (unipar plan / --strategy tp)"
        )
    roles: dict[str, ShardRole] = {}
    for (name, layer), style in zip(layers, plan.layer_tp, strict=True):
        if style is TensorParallelStyle.MEGATRON:
            for path, role in block_roles(name, layer, tp).items():
                roles[f"{name}.{path}"] = role
        elif style is TensorParallelStyle.VOCAB:
            _vocab_style(name, layer, tp)
            roles[name] = ShardRole.VOCAB
    return roles


def apply_tensor_parallel(model: nn.Module, roles: dict[str, ShardRole], tp_mesh: Any) -> nn.Module:
    """Split ``model`` (the whole model or one pipeline stage, on any device) over
    ``tp_mesh`` by the ``roles`` of :func:`tensor_parallel_roles`; layers the model does
    not hold (other stages') are skipped."""
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        RowwiseParallel,
        parallelize_module,
    )

    styles = {}
    for name, module in model.named_modules():
        role = roles.get(name)
        if role is ShardRole.COLUMN:
            styles[name] = ColwiseParallel()
        elif role is ShardRole.ROW:
            styles[name] = RowwiseParallel()
        elif role is ShardRole.VOCAB:
            styles[name] = _vocab_style(name, module, tp_mesh.size())
    parallelize_module(model, tp_mesh, styles)
    return model
