"""Context parallelism: each of ``cp`` ranks holds one contiguous chunk of every
sample's sequence, and attention sees the whole sequence.

Attention runs on DTensors: the chunks of queries, keys and values become one tensor
sharded along the sequence over the ``cp`` mesh, and ``scaled_dot_product_attention``
(PyTorch's math kernel, which DTensor's sharding rules cover on every device) all-gathers
keys and values for the scores, keeps the queries' rows local, and reduce-scatters the
key and value gradients in backward: the all-gather form of context parallelism that
Llama 3 used (Dubey et al. 2024, Sec. 3.3.2), and the form the planner prices. The
causal mask is built for the global sequence, so every rank masks its own rows.

Everything else in a transformer is per token, so each rank runs it on its chunk; the
model shifts its positions by the chunk's first token (``position_offset``, which
unipar's GPT and Llama read). Parameters are replicated over ``cp``: gradients are
averaged over data-parallel and context-parallel ranks together (each rank's loss is
the mean over an equal chunk of tokens, so the average is the replica's mean loss).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.distributed.tensor import DTensor, Shard
from torch.distributed.tensor.experimental import implicit_replication
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.overrides import TorchFunctionMode

from unipar.errors import UnsupportedPlanError
from unipar.plan import Plan

SEQUENCE_DIM = 2  # of [batch, heads, seq, head_dim] as attention takes them


class SequenceShardedAttention(TorchFunctionMode):
    """Runs ``F.scaled_dot_product_attention`` on this rank's chunks as DTensors
    sharded along the sequence over ``mesh``; other calls pass through."""

    def __init__(self, mesh: Any) -> None:
        super().__init__()
        self.mesh = mesh

    def __torch_function__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        kwargs = kwargs or {}
        if func is not F.scaled_dot_product_attention:
            return func(*args, **kwargs)
        q, k, v, *rest = args
        q, k, v = (
            DTensor.from_local(t, self.mesh, [Shard(SEQUENCE_DIM)], run_check=False)
            for t in (q, k, v)
        )
        with sdpa_kernel(SDPBackend.MATH), implicit_replication():
            out = func(q, k, v, *rest, **kwargs)
        return out.to_local()


def position_modules(model: nn.Module) -> list[nn.Module]:
    """The modules that place tokens by position (they read ``position_offset``)."""
    return [m for m in model.modules() if hasattr(m, "position_offset")]


def check_context_parallel(model: nn.Module, plan: Plan) -> None:
    """What context parallelism needs of the plan and the model."""
    mesh = plan.mesh
    if (mesh.pp, mesh.fsdp, mesh.tp) != (1, 1, 1):
        raise UnsupportedPlanError(
            f"the runtime applies context parallelism with data parallelism only, but got "
            f"cp={mesh.cp} with pp={mesh.pp}, fsdp={mesh.fsdp}, tp={mesh.tp}; set pp, fsdp "
            "and tp to 1, or cp to 1"
        )
    if plan.replica_samples:
        raise UnsupportedPlanError(
            f"context parallelism takes even data-parallel shares, but got replica_samples="
            f"{list(plan.replica_samples)}; leave replica_samples out, or set cp to 1"
        )
    if not position_modules(model):
        raise UnsupportedPlanError(
            f"context parallelism needs a model that shifts its positions by a chunk's "
            f"first token (a position_offset attribute, as unipar's GPT and Llama have), "
            f"but {type(model).__name__} has none; set cp to 1"
        )


def apply_context_parallel(model: nn.Module, cp_mesh: Any, cp_rank: int) -> None:
    """Make ``model`` (this rank's replica) compute on its chunk: positions shifted by
    the chunk's start and attention over the whole sequence, for every forward."""
    mode = SequenceShardedAttention(cp_mesh)
    placed = position_modules(model)

    def enter(module: nn.Module, args: tuple) -> None:
        first = cp_rank * args[0].size(1)
        for m in placed:
            m.position_offset = first
        mode.__enter__()

    def leave(module: nn.Module, args: tuple, output: Any) -> None:
        mode.__exit__(None, None, None)

    model.register_forward_pre_hook(enter)
    model.register_forward_hook(leave, always_call=True)


def sequence_chunk(tensor: torch.Tensor, cp_rank: int, cp: int) -> torch.Tensor:
    """This rank's chunk of a [batch, seq, ...] tensor (inputs or per-token targets)."""
    seq = tensor.size(1)
    if seq % cp:
        raise UnsupportedPlanError(
            f"context parallelism splits each sequence into cp={cp} equal chunks, but the "
            f"sequence has {seq} tokens; use a length divisible by {cp}, or another cp"
        )
    size = seq // cp
    return tensor[:, cp_rank * size : (cp_rank + 1) * size]
