"""The cost model: predicted step time and memory per device of a plan. Pure arithmetic.

Sources of the formulas:
- compute: FLOPs over peak x GEMM efficiency, plus a fixed cost per op; memory-bound ops
  as bytes over memory bandwidth (the roofline model, Williams et al. 2009);
- backward = 2 x forward; full recompute adds one forward (Narayanan et al. 2021, Sec. 5.1);
- collectives: ring all-reduce moves 2(n-1)/n of the data per device, reduce-scatter and
  all-gather (n-1)/n each, with one latency per ring step (Thakur et al. 2005); groups that
  span nodes reduce within the node first, so the network carries 1/g of the data per
  device (hierarchical all-reduce, as NCCL does);
- tensor parallel: 2 all-reduces of the layer output per transformer block in forward and
  2 in backward (Shoeybi et al. 2019, Fig. 4); pipeline sends are scattered over the tp
  ranks (Narayanan et al. 2021, Sec. 4.1);
- pipeline: (m + (p-1)/v) microbatch times for 1F1B with v virtual stages, (m + p - 1)
  for GPipe (Narayanan et al. 2021, Sec. 2.2); in-flight microbatches p for 1F1B,
  p(1 + (p-1)/(pv)) interleaved, m for GPipe;
- memory: mixed-precision Adam keeps 2 + 2 + 12 bytes per parameter (weights, gradients,
  fp32 master, momentum, variance), divided by the axes that shard each (ZeRO,
  Rajbhandari et al. 2020); ZeRO-3 gathers weights in forward and backward (1.5x the
  all-reduce traffic);
- data-parallel gradient sync overlaps with the backward of the last microbatch (DDP's
  bucketed all-reduce, Li et al. 2020).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from unipar.analysis.profile import LayerKind, LayerProfile, ModelProfile
from unipar.cluster.spec import GIB, ClusterSpec, LinkSpec
from unipar.plan.plan import Mesh, PipelineSchedule, Plan, Recompute

OPTIMIZER_BYTES_PER_PARAM = 12  # fp32 master weights, Adam momentum and variance
ADAM_STEP_BYTES_PER_PARAM = 30  # read weights, grads, master, m, v; write weights, master, m, v
_AXIS_ORDER = ("tp", "fsdp", "dp", "pp")  # innermost (within a node) first


@dataclass(frozen=True)
class TimeBreakdown:
    compute_s: float
    tp_comm_s: float
    pipeline_bubble_s: float
    p2p_s: float
    grad_sync_s: float
    optimizer_s: float

    @property
    def total_s(self) -> float:
        return (
            self.compute_s
            + self.tp_comm_s
            + self.pipeline_bubble_s
            + self.p2p_s
            + self.grad_sync_s
            + self.optimizer_s
        )


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


@dataclass(frozen=True)
class Estimate:
    time: TimeBreakdown
    memory: MemoryBreakdown
    fits: bool
    model_flops: float  # forward + backward FLOPs of one step, no recompute

    @property
    def step_time_s(self) -> float:
        return self.time.total_s


def group_span(mesh: Mesh, axis: str, devices_per_node: int) -> tuple[int, int]:
    """(devices of one group on one node, nodes the group spans) for a mesh axis, with
    axes laid out innermost first in the order tp, fsdp, dp, pp."""
    size = getattr(mesh, axis)
    stride = math.prod(getattr(mesh, a) for a in _AXIS_ORDER[: _AXIS_ORDER.index(axis)])
    per_node = 1 if stride >= devices_per_node else max(1, min(size, devices_per_node // stride))
    return per_node, math.ceil(size / per_node)


def ring_time(
    nbytes: float, mesh: Mesh, axis: str, cluster: ClusterSpec, *, fraction: float
) -> float:
    """One collective over ``axis``: ``fraction`` is 2 for all-reduce, 1 for reduce-scatter
    or all-gather (times (n-1)/n of the data per device, per level)."""
    size = getattr(mesh, axis)
    if size == 1 or nbytes == 0:
        return 0.0
    per_node, nodes = group_span(mesh, axis, cluster.devices_per_node)
    time = 0.0
    if per_node > 1:
        time += _ring_level(nbytes, per_node, cluster.intra_node, 1.0, fraction)
    if nodes > 1:
        # The node's network is shared by all its devices, whose groups run at once.
        share = per_node / cluster.devices_per_node
        time += _ring_level(nbytes / per_node, nodes, cluster.inter_node, share, fraction)
    return time


def _ring_level(nbytes: float, n: int, link: LinkSpec, share: float, fraction: float) -> float:
    return fraction * (n - 1) / n * nbytes / (link.bandwidth * share) + fraction * (n - 1) * (
        link.latency_s
    )


def layer_forward_time(layer: LayerProfile, samples: int, tp: int, cluster: ClusterSpec) -> float:
    device = cluster.device
    gemm = layer.forward_flops * samples / tp / (device.peak_flops * device.gemm_efficiency)
    moved = (layer.moved_elems_sharded / tp + layer.moved_elems_replicated) * samples
    memory = moved * device.bytes_per_element / device.memory_bandwidth
    return gemm + memory + (layer.matmul_ops + layer.memory_ops) * device.kernel_overhead_s


def tp_allreduces(layer: LayerProfile) -> int:
    """Forward all-reduces of a layer under Megatron-style tensor parallelism."""
    return {LayerKind.BLOCK: 2, LayerKind.EMBEDDING: 1}.get(layer.kind, 0)


def layer_time(layer: LayerProfile, plan: Plan, cluster: ClusterSpec) -> tuple[float, float]:
    """(compute, tp communication) seconds of one microbatch through ``layer``: forward,
    backward and, with full recompute, the forward again."""
    tp, b = plan.mesh.tp, plan.microbatch_size
    passes = 3 + (plan.recompute is Recompute.FULL)
    compute = passes * layer_forward_time(layer, b, tp, cluster)
    message = layer.output_elems * b * cluster.device.bytes_per_element
    one = ring_time(message, plan.mesh, "tp", cluster, fraction=2)
    comm_passes = 2 + (plan.recompute is Recompute.FULL)
    return compute, tp_allreduces(layer) * comm_passes * one


def stage_memory(
    layers: list[LayerProfile], plan: Plan, cluster: ClusterSpec, in_flight: float
) -> MemoryBreakdown:
    mesh, device = plan.mesh, cluster.device
    bpe = device.bytes_per_element
    params = sum(layer.params for layer in layers) / mesh.tp
    zero3 = mesh.fsdp > 1 and plan.reshard_after_forward
    weights = params * bpe / (mesh.fsdp if zero3 else 1)
    gradients = params * bpe / mesh.fsdp
    optimizer = params * OPTIMIZER_BYTES_PER_PARAM / mesh.fsdp
    b = plan.microbatch_size

    def saved(layer: LayerProfile) -> float:
        return (layer.saved_elems_sharded / mesh.tp + layer.saved_elems_replicated) * b * bpe

    if plan.recompute is Recompute.FULL:
        kept = sum(layer.output_elems for layer in layers) * b * bpe  # each layer's input
        activations = kept * in_flight + max(saved(layer) for layer in layers)
    else:
        activations = sum(saved(layer) for layer in layers) * in_flight
    return MemoryBreakdown(
        weights_gib=weights / GIB,
        gradients_gib=gradients / GIB,
        optimizer_gib=optimizer / GIB,
        activations_gib=activations / GIB,
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


def estimate(
    profile: ModelProfile, plan: Plan, cluster: ClusterSpec, stages: list[list[int]]
) -> Estimate:
    """Predict ``plan`` with layers split into ``stages`` (pp x virtual_stages chunks of
    layer indices, in order; chunk ``c`` runs on pipeline rank ``c % pp``)."""
    mesh = plan.mesh
    layers = profile.layers
    per_layer = [layer_time(layer, plan, cluster) for layer in layers]
    bpe = cluster.device.bytes_per_element
    # Per pipeline rank: its chunks' compute and tp comm per microbatch.
    rank_compute = [0.0] * mesh.pp
    rank_tp = [0.0] * mesh.pp
    for chunk, indices in enumerate(stages):
        rank = chunk % mesh.pp
        rank_compute[rank] += sum(per_layer[i][0] for i in indices)
        rank_tp[rank] += sum(per_layer[i][1] for i in indices)
    slowest = max(range(mesh.pp), key=lambda r: rank_compute[r] + rank_tp[r])
    per_micro = rank_compute[slowest] + rank_tp[slowest]
    m = plan.num_microbatches
    p2p = 0.0
    if mesh.pp > 1:
        boundary = layers[stages[0][-1]].output_elems * plan.microbatch_size * bpe / mesh.tp
        per_node, _ = group_span(mesh, "pp", cluster.devices_per_node)
        link = cluster.intra_node if per_node > 1 else cluster.inter_node
        bandwidth = link.bandwidth if per_node > 1 else link.bandwidth / cluster.devices_per_node
        # Forward activation and backward gradient for each of the v chunks.
        p2p = m * 2 * plan.virtual_stages * (boundary / bandwidth + link.latency_s)
    bubble_micro = (
        (mesh.pp - 1) / plan.virtual_stages
        if plan.schedule is not (PipelineSchedule.GPIPE)
        else mesh.pp - 1
    )
    bubble = bubble_micro * per_micro

    stage_params = (
        max(
            sum(layers[i].params for c, idx in enumerate(stages) if c % mesh.pp == r for i in idx)
            for r in range(mesh.pp)
        )
        / mesh.tp
    )
    grad_bytes = stage_params * bpe
    sync = ring_time(grad_bytes, mesh, "dp", cluster, fraction=2)
    if mesh.fsdp > 1:
        gathers = 2 * m if plan.reshard_after_forward else 1  # forward + backward per microbatch
        sync += ring_time(grad_bytes, mesh, "fsdp", cluster, fraction=1)  # reduce-scatter
        sync += gathers * ring_time(grad_bytes, mesh, "fsdp", cluster, fraction=1)
    last_backward = rank_compute[0] * 2 / (3 + (plan.recompute is Recompute.FULL))
    exposed_sync = max(0.0, sync - last_backward)
    optimizer = (
        stage_params / mesh.fsdp * ADAM_STEP_BYTES_PER_PARAM / (cluster.device.memory_bandwidth)
    )
    time = TimeBreakdown(
        compute_s=m * rank_compute[slowest],
        tp_comm_s=m * rank_tp[slowest],
        pipeline_bubble_s=bubble,
        p2p_s=p2p,
        grad_sync_s=exposed_sync,
        optimizer_s=optimizer,
    )
    in_flight = in_flight_microbatches(plan)
    memory = max(
        (
            stage_memory(
                [layers[i] for c, idx in enumerate(stages) if c % mesh.pp == r for i in idx],
                plan,
                cluster,
                in_flight,
            )
            for r in range(mesh.pp)
        ),
        key=lambda mem: mem.total_gib,
    )
    model_flops = 3 * profile.forward_flops * plan.global_batch_size
    return Estimate(
        time=time,
        memory=memory,
        fits=memory.total_gib <= cluster.device.memory_gib,
        model_flops=model_flops,
    )
