"""Tensor parallelism with DTensor's ``parallelize_module``, layer by layer as the plan says.

A ``MEGATRON`` layer (a block) has its linear layers split by role (Shoeybi et al. 2019,
Sec. 3): projections into the heads or the MLP's inner width column-wise, the
projections back to the residual width row-wise, so each attention or MLP costs one
all-reduce forward and one backward. Roles are read from the names the common model
families use (``wq``/``q_proj``/``fc``/``w1`` ... in, ``wo``/``o_proj``/``proj``/``w2``
... out). A ``VOCAB`` layer splits an embedding or output projection along the
vocabulary, its output gathered whole. ``REPLICATE`` layers stay whole on every rank.

Hugging Face models: where a model declares its own tensor-parallel plan (Llama,
Mistral, Qwen2: ``_tp_plan`` / ``config.base_model_tp_plan``, :func:`unipar.models.hf.tp_plan`),
a linear layer's role is the plan's (``colwise``: column, ``rowwise``: row); a style
unipar does not apply (fused ``packed_colwise``, experts) is refused by name. Without
one, roles come from names; BERT-style encoders name theirs by place: attention
``query``/``key``/``value`` column-wise and ``attention.output.dense`` row-wise, the
MLP's ``intermediate.dense`` column-wise and ``output.dense`` row-wise, as Megatron-LM
splits BERT (Shoeybi et al. 2019, Sec. 3). Their attention reshapes with
``view(..., -1, head_dim)``, so each rank's head count follows from its shard, and tp
must divide the key/value heads (grouped-query attention). Composite embedding layers
(BERT's word, position and token-type tables with their norm) stay replicated.

GPT-2's ``Conv1D`` stores its weight (in, out), so its column-wise shard is along dim 1
and its row-wise shard along dim 0. Its fused
``c_attn`` (output ``[q | k | v]``) is role ``"fused_qkv"``: computed column-wise, its
output gathered (an all-gather of the 3 x hidden activations, reduce-scattered in
backward) and each rank keeps its own heads' q, k and v, the attention told its
local ``num_heads`` and ``split_size``. Tied parameters (GPT-2's word embedding and
head) are tied again after sharding.
"""

from __future__ import annotations

import functools
from enum import Enum
from functools import partial
from typing import Any

import torch
from torch import nn

from unipar.analysis.profile import layer_sequence
from unipar.errors import UnsupportedPlanError
from unipar.models import hf
from unipar.plan import Plan, TensorParallelStyle
from unipar.runtime.parallel.sequence import sequence_parallel_styles
from unipar.runtime.parallel.stages import tied_parameters

COLUMN_WISE_NAMES = frozenset(
    {"wq", "wk", "wv", "q_proj", "k_proj", "v_proj", "query", "key", "value"}
    | {"fc", "fc1", "c_fc", "w1", "w3", "gate_proj", "up_proj"}
)
ROW_WISE_NAMES = frozenset({"wo", "o_proj", "out_proj", "proj", "fc2", "c_proj", "w2", "down_proj"})
# Named by place (BERT, RoBERTa, ELECTRA ...): the path's last two parts.
ROLE_BY_PLACE = {"intermediate.dense": "column", "output.dense": "row"}
DECLARED_ROLES = {"colwise": "column", "rowwise": "row"}  # a model's own plan's styles
_WITHOUT_TP = "dp, fsdp and pp (plans with tp=1)"


class ShardRole(Enum):
    """How one module splits over the tp axis."""

    COLUMN = "column"  # output features split (into heads or the MLP's inner width)
    ROW = "row"  # input features split (back to the residual width), outputs all-reduced
    VOCAB = "vocab"  # embedding or output projection split along the vocabulary
    # GPT-2's fused c_attn (output [q | k | v]): computed column-wise, each rank's shard
    # holding its heads' queries, keys and values
    FUSED_QKV = "fused_qkv"


_CONV1D_ROLES = (ShardRole.COLUMN, ShardRole.ROW, ShardRole.FUSED_QKV)


def block_roles(
    block_name: str, block: nn.Module, tp: int, declared: dict[str, str] | None = None
) -> dict[str, ShardRole]:
    """``{linear layer path inside the block: COLUMN, ROW or FUSED_QKV}``, or a
    clear error when the block cannot be split by role. ``declared``: the model's own
    tensor-parallel plan (:func:`unipar.models.hf.tp_plan`), followed where it names a
    layer."""
    roles: dict[str, ShardRole] = {}
    unknown: list[str] = []
    for path, module in block.named_modules():
        leaf = path.rpartition(".")[2]
        place = ".".join(path.split(".")[-2:])
        if isinstance(module, nn.MultiheadAttention):
            raise UnsupportedPlanError(
                f"tensor parallel cannot split layer {block_name!r}: {path} is an "
                "nn.MultiheadAttention, whose query, key and value share one fused weight "
                "(in_proj_weight). Write attention with separate wq, wk, wv, wo nn.Linear "
                f"layers to use tp, or use {_WITHOUT_TP}"
            )
        if not isinstance(module, nn.Linear) and not hf.is_conv1d(module):
            continue
        rows, columns = _input_output_widths(module)
        style = hf.declared_style(declared or {}, f"{block_name}.{path}")
        if style is not None and style not in DECLARED_ROLES:
            raise UnsupportedPlanError(
                f"{type(block).__name__}'s model declares tensor-parallel style {style!r} for "
                f"{block_name}.{path}, which unipar does not apply (it splits linear layers "
                f"{sorted(DECLARED_ROLES)}); use {_WITHOUT_TP}"
            )
        role = DECLARED_ROLES.get(style or "") or ROLE_BY_PLACE.get(place)
        if hf.is_conv1d(module) and hf.fused_qkv_attention(block, path) is not None:
            roles[path], width = ShardRole.FUSED_QKV, hf.fused_qkv_attention(block, path).num_heads
        elif role == "column" or (role is None and leaf in COLUMN_WISE_NAMES):
            roles[path], width = ShardRole.COLUMN, columns
        elif role == "row" or (role is None and leaf in ROW_WISE_NAMES):
            roles[path], width = ShardRole.ROW, rows
        else:
            unknown.append(path)
            continue
        if width % tp:
            raise UnsupportedPlanError(
                f"tensor parallel splits {block_name}.{path} into tp={tp} parts along a "
                f"width of {width}, which tp does not divide; choose a tp that divides {width}"
            )
    known = sorted((path, role.value) for path, role in roles.items())
    if (
        unknown
        or not {ShardRole.COLUMN, ShardRole.FUSED_QKV} & set(roles.values())
        or ShardRole.ROW not in roles.values()
    ):
        raise UnsupportedPlanError(
            f"tensor parallel cannot split layer {block_name!r} ({type(block).__name__}): it "
            "splits a block's linear layers by role, column-wise into the heads or inner "
            f"width (names {sorted(COLUMN_WISE_NAMES)}) and row-wise back "
            f"(names {sorted(ROW_WISE_NAMES)}), or as the model's own tensor-parallel "
            "plan says; this block has linear layers "
            f"{sorted(unknown) or 'none'} of unknown role and "
            f"{known or 'no known ones'}. Rename its linear layers by role, "
            f"or use {_WITHOUT_TP}"
        )
    return roles


def _input_output_widths(module: nn.Module) -> tuple[int, int]:
    """(in, out) features of an ``nn.Linear`` (weight (out, in)) or ``Conv1D`` (weight
    (in, out))."""
    rows, columns = module.weight.shape
    return (rows, columns) if hf.is_conv1d(module) else (columns, rows)


def _vocab_style(name: str, layer: nn.Module, tp: int) -> Any:
    from torch.distributed.tensor import Replicate  # noqa: PLC0415 (heavy: torch.distributed.tensor)
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel  # noqa: PLC0415 (heavy: torch.distributed.tensor)

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
    if len(plan.layer_tp) != len(layers):
        raise UnsupportedPlanError(
            f"a plan with tp={tp} needs a tensor-parallel style for each of the model's "
            f"{len(layers)} layers, but layer_tp has {len(plan.layer_tp)}; plan this model "
            "with the planner (unipar plan / --strategy tp)"
        )
    hf.check_heads(model, tp)
    declared = hf.tp_plan(model)
    roles: dict[str, ShardRole] = {}
    for (name, layer), style in zip(layers, plan.layer_tp, strict=True):
        if style is TensorParallelStyle.MEGATRON:
            for path, role in block_roles(name, layer, tp, declared).items():
                roles[f"{name}.{path}"] = role
        elif style is TensorParallelStyle.VOCAB:
            _vocab_style(name, layer, tp)
            roles[name] = ShardRole.VOCAB
    return roles


def apply_tensor_parallel(
    model: nn.Module,
    roles: dict[str, ShardRole],
    tp_mesh: Any,
    *,
    sequence_parallel: bool = False,
) -> nn.Module:
    """Split ``model`` (the whole model or one pipeline stage, on any device) over
    ``tp_mesh`` by the ``roles`` of :func:`tensor_parallel_roles`; layers the model does
    not hold (other stages') are skipped. Parameters tied before are tied after."""
    from torch.distributed.tensor.parallel import (  # noqa: PLC0415 (heavy: torch.distributed.tensor)
        ColwiseParallel,
        RowwiseParallel,
        parallelize_module,
    )

    ties = tied_parameters(model)
    styles = {}
    for name, module in model.named_modules():
        role = roles.get(name)
        if not any(True for _ in module.parameters()):
            continue  # held by another pipeline stage: a pass-through stands in for it
        if role in _CONV1D_ROLES and hf.is_conv1d(module):
            styles[name] = _conv1d_styles()[role]()
        elif role is ShardRole.COLUMN:
            styles[name] = ColwiseParallel()
        elif role is ShardRole.ROW:
            styles[name] = RowwiseParallel()
        if role is ShardRole.FUSED_QKV:
            parent_name, _, _ = name.rpartition(".")
            hf.shard_attention_heads(model.get_submodule(parent_name), tp_mesh.size())
        elif role is ShardRole.VOCAB:
            styles[name] = _vocab_style(name, module, tp_mesh.size())
    if sequence_parallel:
        styles = sequence_parallel_styles(model, styles)
    parallelize_module(model, tp_mesh, styles)
    _tie_again(model, ties)
    return model


def _tie_again(model: nn.Module, ties: list[list[str]]) -> None:
    """``parallelize_module`` gives each module its own sharded parameter: make the
    parameters that were one tensor one again (they must be sharded alike)."""
    for first, *others in ties:
        shared = model.get_parameter(first)
        for name in others:
            own = model.get_parameter(name)
            if placements(own) != placements(shared) or own.shape != shared.shape:
                raise UnsupportedPlanError(
                    f"parameters {first!r} and {name!r} are one tensor (tied weights), but "
                    f"the plan shards them differently under tensor parallel "
                    f"({placements(shared)} vs {placements(own)}); give both layers the "
                    "same tensor-parallel style (the planner splits both by vocabulary)"
                )
            owner, _, leaf = name.rpartition(".")
            setattr(model.get_submodule(owner), leaf, shared)


def placements(tensor: torch.Tensor) -> tuple:
    """A DTensor's placements; ``()`` for a plain tensor."""
    return tuple(getattr(tensor, "placements", ()))


@functools.cache
def _conv1d_styles() -> dict[str, type]:
    """Parallel styles for ``Conv1D`` (defined on first use: DTensor is imported late)."""
    from torch.distributed.tensor import Replicate, Shard, distribute_module  # noqa: PLC0415 (heavy: torch.distributed.tensor)
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel  # noqa: PLC0415 (heavy: torch.distributed.tensor)

    class Conv1DColwise(ColwiseParallel):
        """Column-wise for ``Conv1D``: weight (in, out) split along out (dim 1)."""

        def _apply(self, module: nn.Module, device_mesh: Any) -> nn.Module:
            return distribute_module(
                module,
                device_mesh,
                partial(_distribute_conv1d, Shard(1), Shard(0)),
                partial(self._prepare_input_fn, self.input_layouts, self.desired_input_layouts),
                self._output_fn(),
            )

        def _output_fn(self) -> Any:
            return partial(self._prepare_output_fn, self.output_layouts, self.use_local_output)

    class FusedQKV(Conv1DColwise):
        """GPT-2's ``c_attn``: column-wise, then each rank keeps its heads' q, k, v."""

        def _output_fn(self) -> Any:
            return _own_heads

    class Conv1DRowwise(RowwiseParallel):
        """Row-wise for ``Conv1D``: weight (in, out) split along in (dim 0), the output
        summed over ranks."""

        def _apply(self, module: nn.Module, device_mesh: Any) -> nn.Module:
            self.desired_input_layouts = (Shard(-1),)
            return distribute_module(
                module,
                device_mesh,
                partial(_distribute_conv1d, Shard(0), Replicate()),
                partial(self._prepare_input_fn, self.input_layouts, self.desired_input_layouts),
                partial(self._prepare_output_fn, self.output_layouts, self.use_local_output),
            )

    return {
        ShardRole.COLUMN: Conv1DColwise,
        ShardRole.ROW: Conv1DRowwise,
        ShardRole.FUSED_QKV: FusedQKV,
    }


def _distribute_conv1d(weight: Any, bias: Any, _name: str, module: nn.Module, mesh: Any) -> None:
    """Shard a ``Conv1D``'s weight and bias by the given placements."""
    from torch.distributed.tensor import distribute_tensor  # noqa: PLC0415 (heavy: torch.distributed.tensor)

    for name, placement in (("weight", weight), ("bias", bias)):
        param = getattr(module, name, None)
        if param is not None:
            dist = distribute_tensor(param, mesh, [placement])
            module.register_parameter(name, nn.Parameter(dist, requires_grad=param.requires_grad))


def _own_heads(_module: nn.Module, outputs: Any, mesh: Any) -> torch.Tensor:
    """This rank's heads' q, k and v from the fused output ``[q | k | v]``.

    Every rank reads only its heads' columns of the gathered output: the gradients of
    the gathered tensor are partial sums, reduce-scattered back to the shards."""
    from torch.distributed.tensor import Partial, Replicate  # noqa: PLC0415 (heavy: torch.distributed.tensor)

    full = outputs.redistribute(placements=[Replicate()]).to_local(grad_placements=[Partial()])
    rank, size = mesh.get_local_rank(), mesh.size()
    parts = [part.chunk(size, dim=-1)[rank] for part in full.chunk(3, dim=-1)]
    return torch.cat(parts, dim=-1)
