"""Tensor parallelism's collectives as the runtime runs them, per layer and micro-batch,
and the partial gradients sequence parallelism leaves to the optimizer: counts for the
cost model (:mod:`unipar.plan.cost`) and the CPU calibration
(:mod:`unipar.runtime.calibrate_group`). Pure.
"""

from __future__ import annotations

from unipar.analysis.profile import LayerKind, LayerProfile
from unipar.plan.collectives import Collective


def tp_allreduces(layer: LayerProfile) -> int:
    """Forward all-reduces of a layer under Megatron-style tensor parallelism (none for
    a layer of several embedding tables, which stays replicated); a block's as the
    runtime runs them: :func:`block_tp_collectives`."""
    if layer.kind is LayerKind.EMBEDDING:
        return 1 if layer.splittable_modules == 1 else 0
    return 2 if layer.kind is LayerKind.BLOCK else 0


ROW_WISE_PER_BLOCK = 2  # attention's output projection and the MLP's (Shoeybi et al. 2019)


def block_tp_collectives(
    layer: LayerProfile, sequence_parallel: bool, overlaps: bool
) -> tuple[tuple[Collective, int, int], ...]:
    """(collective, per forward, per backward) of one micro-batch through a block split
    by the runtime (DTensor's ``ColwiseParallel`` / ``RowwiseParallel``, one module at a
    time: :mod:`unipar.runtime.parallel.tensor`), each of an activation of the residual
    width. Its row-wise layers are the attention's and the MLP's output projections
    (2); the other split modules are column-wise (4 for separate q, k, v and an MLP's
    input; Megatron fuses q, k, v into one, Shoeybi et al. 2019, Fig. 3).

    - plain tp: each row-wise layer all-reduces its output in forward, each
      column-wise layer its input's gradient in backward (every column-wise layer
      takes its input as its own replicated DTensor, so q, k and v are three);
    - sequence parallel (:mod:`unipar.runtime.parallel.sequence`): each column-wise
      layer all-gathers its sequence-sharded input in forward and reduce-scatters the
      gradient in backward, each row-wise layer reduce-scatters its output in forward
      and all-gathers the gradient in backward, and the block all-gathers its output
      whole in forward and its input's gradient in backward.

    The counts are the runtime's as torch.profiler lists them for the benchmark's GPT
    (4 blocks, tp=2, one micro-batch, gloo; 2026-11-26): plain tp 24 all-reduces in
    the blocks (8 forward, 16 backward); with sequence parallelism 20 all-gathers and
    8 reduce-scatters in forward, 12 all-gathers and 16 reduce-scatters in backward.

    ``overlaps``: where the device computes and communicates at once (GPUs: the
    collectives are issued asynchronously and waited for where their result is used),
    the model keeps Megatron's count, one collective per attention and per MLP and
    pass (Shoeybi et al. 2019; Korthikanti et al. 2022, Sec. 4.2.2), the published runs
    being within 15% of it (``tests/test_planner_modern_reference.py``): the
    collectives of the same input (q, k, v) are taken as hidden behind the next one's
    compute, which is not measured on a GPU here. One-thread CPU workers under gloo
    wait for each one."""
    rows = ROW_WISE_PER_BLOCK
    columns = rows if overlaps else max(layer.splittable_modules - rows, rows)
    return tp_collective_counts(columns, rows, sequence_parallel, block_gathers=not overlaps)


def tp_collective_counts(
    columns: int, rows: int, sequence_parallel: bool, *, block_gathers: bool = True
) -> tuple[tuple[Collective, int, int], ...]:
    """(collective, per forward, per backward) of a block with ``columns`` column-wise
    and ``rows`` row-wise layers (:func:`block_tp_collectives`); ``block_gathers``: the
    block's own all-gathers under sequence parallelism (its output whole in forward,
    its input's gradient in backward) are counted."""
    gathers = 1 if block_gathers else 0
    if not sequence_parallel:
        return ((Collective.ALL_REDUCE, rows, columns),)
    return (
        (Collective.ALL_GATHER, columns + gathers, rows + gathers),
        (Collective.REDUCE_SCATTER, rows, columns),
    )


def sequence_parallel_partial_grads(layer: LayerProfile) -> int:
    """Parameter tensors of a block that sequence parallelism leaves replicated while
    their inputs are sharded along the sequence: the norms' and the row-wise layers'
    biases, whose gradients stay partial sums (DTensor ``Partial``) until the optimizer
    reads them. A block whose tensors number at least twice its linear layers holds a
    bias in each (GPT's), so its replicated tensors are the rest less the split
    weights and the column-wise biases; one without biases (Llama's) keeps its norms'."""
    if layer.kind is not LayerKind.BLOCK:
        return 0
    split = layer.splittable_modules
    columns = max(split - ROW_WISE_PER_BLOCK, ROW_WISE_PER_BLOCK)
    with_biases = layer.param_tensors >= 2 * split
    return max(layer.param_tensors - split - (columns if with_biases else 0), 0)
