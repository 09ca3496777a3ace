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


def _is_norm(module: nn.Module) -> bool:
    return isinstance(module, nn.LayerNorm) or type(module).__name__.endswith("RMSNorm")


def _is_dropout(module: nn.Module) -> bool:
    return isinstance(module, nn.Dropout)


def _is_row_wise(style: Any) -> bool:
    from torch.distributed.tensor.parallel import RowwiseParallel  # noqa: PLC0415 (heavy: torch.distributed.tensor)

    return isinstance(style, RowwiseParallel)


def sequence_parallel_styles(model: nn.Module, styles: dict[str, Any]) -> dict[str, Any]:
    """``styles`` (tensor parallel's, per module path) with the blocks holding
    column/row-wise layers turned sequence parallel (see module doc)."""
    from torch.distributed.tensor import Shard  # noqa: PLC0415 (heavy: torch.distributed.tensor)
    from torch.distributed.tensor.parallel import (  # noqa: PLC0415 (heavy: torch.distributed.tensor)
        ColwiseParallel,
        SequenceParallel,
    )

    row_wise = [name for name, style in styles.items() if _is_row_wise(style)]
    blocks = [name for name, _ in layer_sequence(model) if _inside_any(row_wise, name)]
    result = dict(styles)
    for name, style in styles.items():
        if not _inside(name, blocks):
            continue
        if _is_row_wise(style):
            result[name] = type(style)(output_layouts=Shard(1), use_local_output=False)
        elif isinstance(style, ColwiseParallel):
            result[name] = type(style)(input_layouts=Shard(1))
        else:
            raise UnsupportedPlanError(
                f"sequence parallelism supports blocks of linear layers split column- "
                f"and row-wise, but {name} is split as {type(style).__name__}; set "
                "sequence_parallel to false"
            )
    for block in blocks:
        for path, module in model.get_submodule(block).named_modules():
            # norms anywhere, dropout on the residual stream (the block's own)
            if (path and _is_norm(module)) or (path.count(".") == 0 and _is_dropout(module)):
                result[f"{block}.{path}"] = SequenceParallel()
        result[block] = _BlockLayouts()
    return result


def _inside(name: str, blocks: list[str]) -> bool:
    return any(name.startswith(f"{block}.") for block in blocks)


def _inside_any(names: list[str], block: str) -> bool:
    return any(name.startswith(f"{block}.") for name in names)


class _BlockLayouts:
    """A block's input (its first argument) sliced along the sequence, its output (or
    the output's first element) gathered whole; other arguments pass as they are."""

    def __new__(cls) -> Any:
        from torch.distributed.tensor import DTensor, Replicate, Shard  # noqa: PLC0415 (heavy: torch.distributed.tensor)
        from torch.distributed.tensor.parallel.style import ParallelStyle  # noqa: PLC0415 (heavy: torch.distributed.tensor)

        def whole(output: Any) -> Any:
            return output.redistribute(placements=[Replicate()]).to_local()

        class BlockLayouts(ParallelStyle):
            def _apply(self, module: nn.Module, device_mesh: Any) -> nn.Module:
                def shard_input(_module: nn.Module, args: tuple) -> tuple:
                    x = DTensor.from_local(args[0], device_mesh, [Replicate()], run_check=False)
                    return (x.redistribute(placements=[Shard(1)]), *args[1:])

                def gather_output(_module: nn.Module, _args: tuple, output: Any) -> Any:
                    if isinstance(output, tuple):
                        return (whole(output[0]), *output[1:])
                    return whole(output)

                module.register_forward_pre_hook(shard_input)
                module.register_forward_hook(gather_output)
                return module

        return BlockLayouts()
