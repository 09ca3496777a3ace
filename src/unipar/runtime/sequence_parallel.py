"""Sequence parallelism inside tensor parallel (Megatron-SP, Korthikanti et al. 2022,
Sec. 4.2.2), with DTensor's ``SequenceParallel`` as torchtitan applies it.

In each tensor-parallel block the norms and dropout run on 1/tp of the sequence
(``Shard(1)``): the column-wise layers all-gather the sequence on their input, the
row-wise layers reduce-scatter their output back to sequence shards (in place of
tensor parallel's all-reduce). Blocks take and return whole activations, so the
layers between them (embeddings, the final norm, the head) are as under plain tp:
each block shards its input along the sequence (a local slice, no communication) and
all-gathers its output.
"""

from __future__ import annotations

from typing import Any

from torch import nn

from unipar.analysis.profile import layer_sequence
from unipar.errors import UnsupportedPlanError


def _is_norm_or_dropout(module: nn.Module) -> bool:
    name = type(module).__name__
    return isinstance(module, (nn.LayerNorm, nn.Dropout)) or name.endswith("RMSNorm")


def sequence_parallel_styles(model: nn.Module, styles: dict[str, Any]) -> dict[str, Any]:
    """``styles`` (tensor parallel's, per module path) with the blocks holding
    column/row-wise layers turned sequence parallel (see module doc)."""
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        PrepareModuleInput,
        PrepareModuleOutput,
        RowwiseParallel,
        SequenceParallel,
    )

    row_wise = [name for name, style in styles.items() if type(style) is RowwiseParallel]
    blocks = [name for name, _ in layer_sequence(model) if _inside_any(row_wise, name)]
    result = dict(styles)
    for name, style in styles.items():
        if type(style) is ColwiseParallel and _inside(name, blocks):
            result[name] = ColwiseParallel(input_layouts=Shard(1))
        elif type(style) is RowwiseParallel and _inside(name, blocks):
            result[name] = RowwiseParallel(output_layouts=Shard(1), use_local_output=False)
        elif _inside(name, blocks):
            raise UnsupportedPlanError(
                f"sequence parallelism supports blocks of nn.Linear layers split column- "
                f"and row-wise, but {name} is split as {type(style).__name__}; set "
                "sequence_parallel to false"
            )
    for block in blocks:
        for path, module in model.get_submodule(block).named_modules():
            if path and _is_norm_or_dropout(module):
                result[f"{block}.{path}"] = SequenceParallel()
        result[block] = _BlockLayouts(PrepareModuleInput, PrepareModuleOutput, Replicate, Shard)
    return result


def _inside(name: str, blocks: list[str]) -> bool:
    return any(name.startswith(f"{block}.") for block in blocks)


def _inside_any(names: list[str], block: str) -> bool:
    return any(name.startswith(f"{block}.") for name in names)


def _BlockLayouts(prepare_input, prepare_output, replicate, shard):  # type: ignore[no-untyped-def]
    """A block's input sliced along the sequence, its output gathered whole."""
    from torch.distributed.tensor.parallel.style import ParallelStyle

    class BlockLayouts(ParallelStyle):
        def _apply(self, module: nn.Module, device_mesh: Any) -> nn.Module:
            prepare_input(input_layouts=(replicate(),), desired_input_layouts=(shard(1),))._apply(
                module, device_mesh
            )
            prepare_output(
                output_layouts=(shard(1),),
                desired_output_layouts=(replicate(),),
                use_local_output=True,
            )._apply(module, device_mesh)
            return module

    return BlockLayouts()
