"""Memory per device of a plan, for the pipeline rank that needs the most. Pure arithmetic.

Sources of the formulas:
- mixed-precision Adam keeps 2 + 2 + 12 bytes per parameter (weights, gradients, fp32
  master, momentum, variance), divided by the axes that shard each (ZeRO, Rajbhandari et
  al. 2020); a distributed optimizer (ZeRO-1) shards the optimizer state over dp x cp;
- activations saved for backward per microbatch, times the microbatches in flight: p for
  1F1B, p(1 + (p-1)/(pv)) interleaved, m for GPipe (Narayanan et al. 2021, Sec. 2.2);
  full recompute keeps each layer's input only (Sec. 5.1); selective recompute stores no
  attention core (Korthikanti et al. 2022, Sec. 5); torchtitan's op-level policy keeps
  the attention output and every other product's output (``_save_list`` in its llama3
  ``parallelize.py``); the math attention path stores the scores, a flash kernel none
  (Dao et al. 2022).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from unipar.analysis.profile import LayerKind, LayerProfile
from unipar.cluster.spec import GIB, AttentionKernel, ClusterSpec
from unipar.plan.representation import PipelineSchedule, Plan, Recompute

OPTIMIZER_BYTES_PER_PARAM = 12  # fp32 master weights, Adam momentum and variance


@dataclass(frozen=True)
class MemoryBreakdown:
    weights_gib: float
    gradients_gib: float
    optimizer_gib: float
    activations_gib: float
    reserved_gib: float

    @property
    def total_gib(self) -> float:
        return (
            self.weights_gib
            + self.gradients_gib
            + self.optimizer_gib
            + self.activations_gib
            + self.reserved_gib
        )


def op_level_saved_elems(layer: LayerProfile) -> tuple[float, float]:
    """(sharded, replicated) elements per sample a layer keeps for backward under
    ``selective_op``: a block keeps its input, its attention output and the outputs of
    its odd products (each product's output taken as half the activation elements it
    reads and writes: exact for square products, and for the MLP's up and down
    projections together); other layers keep what they keep without recompute."""
    if layer.kind is not LayerKind.BLOCK:
        return layer.saved_elems_sharded, layer.saved_elems_replicated
    products = sum(act / 2 for _, act, _ in layer.matmuls[0::2])
    attention_output = layer.output_elems if layer.attention_matmuls else 0.0
    return products + attention_output, layer.output_elems


@dataclass(frozen=True)
class MemoryTerms:
    """The parts of :func:`rank_memory` that do not depend on the micro-batch, its
    count or the schedule, for one set of rank loads, tp and sequence parallelism:
    computed once and shared by the plans that differ only in those."""

    saved: np.ndarray  # [ranks]: elements saved for backward per sample
    largest: np.ndarray  # [ranks]: the largest layer's
    op_kept: np.ndarray  # [ranks]: kept under op-level selective recompute
    kept_inputs: np.ndarray  # [ranks]: layer inputs, over sp
    largest_layer: np.ndarray  # [ranks]: bytes of the largest layer's weights, over tp
    params: np.ndarray  # [ranks]: parameters over tp


def memory_terms(loads: RankLoads, plan: Plan, cluster: ClusterSpec) -> MemoryTerms:
    mesh, device = plan.mesh, cluster.device
    bpe, tp = device.bytes_per_element, mesh.tp
    sp = tp if plan.sequence_parallel else 1
    scores = stores_scores(plan, cluster)
    saved = loads.saved_sharded / tp + loads.saved_replicated / sp
    if scores:
        saved = saved + loads.saved_attention / tp
    # One layer's activations exist while it recomputes.
    largest = (
        loads.layer_saved_sharded / tp
        + loads.layer_saved_replicated / sp
        + (loads.layer_saved_attention / tp if scores else 0)
    ).max(axis=1)
    return MemoryTerms(
        saved=saved,
        largest=largest,
        op_kept=loads.op_saved_sharded / tp + loads.op_saved_replicated / sp,
        kept_inputs=loads.kept_inputs / sp,
        largest_layer=loads.layer_params.max(axis=1) / tp * bpe,
        params=loads.params / tp,
    )


def stores_scores(plan: Plan, cluster: ClusterSpec) -> bool:
    """Whether attention scores are stored: by the math path only, without selective
    recompute."""
    return cluster.device.attention is AttentionKernel.MATH and plan.recompute not in (
        Recompute.SELECTIVE_OP,
        Recompute.SELECTIVE,
    )


def rank_memory(
    loads: RankLoads,
    plan: Plan,
    cluster: ClusterSpec,
    in_flight: float,
    terms: MemoryTerms | None = None,
) -> MemoryBreakdown:
    """Memory of the pipeline rank that needs the most (``terms``: its
    :func:`memory_terms`, when already made)."""
    mesh, device = plan.mesh, cluster.device
    bpe, b = device.bytes_per_element, plan.microbatch_size / mesh.cp
    t = memory_terms(loads, plan, cluster) if terms is None else terms
    activations = t.saved * b * bpe * in_flight
    if plan.recompute is Recompute.SELECTIVE_OP:
        activations = (t.op_kept * in_flight + t.largest) * b * bpe
    if plan.recompute is Recompute.FULL:
        # A recomputing layer keeps its input. The share 1 - f of layers that do not
        # recompute keep their activations.
        f = plan.recomputed_fraction
        kept = (t.kept_inputs * in_flight + t.largest) * b * bpe
        activations = f * kept + (1 - f) * activations
    zero3 = mesh.fsdp > 1 and plan.reshard_after_forward
    optimizer_shards = mesh.fsdp * (mesh.dp * mesh.cp if plan.distributed_optimizer else 1)
    per_param = (
        bpe / (mesh.fsdp if zero3 else 1)
        + bpe / mesh.fsdp
        + OPTIMIZER_BYTES_PER_PARAM / optimizer_shards
    )
    # Sharded weights and gradients exist whole for the layer at work: ZeRO-3 holds the
    # gathered weights of the current and the prefetched layer, and with any sharding
    # one layer's full gradient waits for its reduce-scatter.
    working = t.largest_layer * ((2 if zero3 else 0) + (1 if mesh.fsdp > 1 else 0))
    totals = t.params * per_param + activations + working
    rank = int(np.argmax(totals))
    params = float(t.params[rank])
    return MemoryBreakdown(
        weights_gib=(params * bpe / (mesh.fsdp if zero3 else 1) + float(working[rank])) / GIB,
        gradients_gib=params * bpe / mesh.fsdp / GIB,
        optimizer_gib=params * OPTIMIZER_BYTES_PER_PARAM / optimizer_shards / GIB,
        activations_gib=float(activations[rank]) / GIB,
        reserved_gib=device.reserved_gib,
    )


def in_flight_microbatches(plan: Plan) -> float:
    p, m, v = plan.mesh.pp, plan.num_microbatches, plan.virtual_stages
    if p == 1:
        return 1.0
    if plan.schedule is PipelineSchedule.GPIPE:
        return float(m)
    if plan.schedule is PipelineSchedule.INTERLEAVED_1F1B:
        return min(m * v, p * (1 + (p - 1) / (p * v)))
    return float(min(m, p))


@dataclass(frozen=True)
class RankLoads:
    """What each pipeline rank holds, as arrays over ranks (rows) for fast estimates."""

    counts: np.ndarray  # [ranks, distinct layers]: how many of each layer
    params: np.ndarray  # [ranks]
    kept_inputs: np.ndarray  # [ranks]: each layer's input, kept under full recompute
    saved_sharded: np.ndarray  # [ranks]: elements saved for backward
    saved_replicated: np.ndarray
    saved_attention: np.ndarray  # scores, stored by the math path only
    op_saved_sharded: np.ndarray  # [ranks]: kept under op-level selective recompute
    op_saved_replicated: np.ndarray
    layer_params: np.ndarray  # [ranks, distinct layers], 0 where absent
    layer_saved_sharded: np.ndarray
    layer_saved_replicated: np.ndarray
    layer_saved_attention: np.ndarray
