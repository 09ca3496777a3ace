"""Step time of a 3D plan (tensor x data x pipeline) placed rank by rank on the nodes of
a heterogeneous cluster, each node with its own devices, intra-node link and network.

What it models, as a synchronous pipeline engine of the DeepSpeed kind runs it:

- Ranks in pipe-data-model order (model innermost: ``rank = m + tp*(d + dp*stage)``,
  DeepSpeed's ``PipeDataParallelTopology``), ``devices_per_node`` consecutive ranks per
  node, nodes in the given order.
- A stage's micro-batch: forward and backward FLOPs over ``tp`` at the sustained rate of
  its slowest node, plus Megatron's tensor-parallel all-reduces inside the node (ring:
  ``2 (n-1)/n * bytes / bandwidth + 2 (n-1) * latency``, Patarasuk & Yuan 2009).
- Between stages, per micro-batch: the activation, split over the ``tp`` ranks and
  gathered on the receiving node, and its gradient, sent whole by every ``tp`` rank
  (DeepSpeed's pipe engine partitions activations, not gradients). Transfers that leave
  a node share its network: the time is the busiest network's bytes over its bandwidth.
- Pipeline: ``sum_k t_k + (M - 1) max_k t_k`` for ``M`` micro-batches, a stage's ``t_k``
  holding its compute and the transfers on both its sides (blocking send and receive).
- After the last micro-batch (not overlapped): the gradient all-reduce of every
  data-parallel group at once (``grad_bytes`` per element; the rings of all groups
  share each node's network: NCCL's rings enter and leave each node once), the
  all-reduce of weights tied between the first and last stage, and the optimizer step
  (``optimizer_bytes`` of memory traffic per parameter at the node's memory bandwidth).

Pure arithmetic: no Ray, no processes.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

from unipar.cluster.spec import LinkSpec
from unipar.errors import ConfigError
from unipar.plan.hetero import LayerProfile


@dataclass(frozen=True)
class PlacedNode:
    """One node: ``devices`` devices of ``flops`` sustained FLOP/s each (the rate of a
    whole training step's arithmetic) and ``memory_bandwidth`` bytes/s; ``intra``:
    the per-device link inside the node; ``network``: the node's network, shared."""

    name: str
    devices: int
    flops: float
    memory_bandwidth: float
    intra: LinkSpec
    network: LinkSpec


@dataclass(frozen=True)
class Placed3DPlan:
    """``stage_starts``: first layer of each stage and the layer count at the end
    (``pp + 1`` numbers)."""

    global_batch_size: int
    microbatch_size: int
    tp: int
    dp: int
    pp: int
    stage_starts: tuple[int, ...]


@dataclass(frozen=True)
class Precisions:
    """Bytes per element: gradients in the data-parallel all-reduce (4: DeepSpeed's
    ``fp32_allreduce``); tied-weight gradients; optimizer memory traffic per parameter.
    Activations take the layers' ``output_bytes`` as they are."""

    gradient: int = 4
    tied_gradient: int = 2
    optimizer: int = 32


@dataclass(frozen=True)
class StepBreakdown:
    pipeline_s: float
    data_parallel_s: float
    tied_s: float
    optimizer_s: float

    @property
    def total_s(self) -> float:
        return self.pipeline_s + self.data_parallel_s + self.tied_s + self.optimizer_s


def _ring(nbytes: float, ranks: int, link: LinkSpec) -> float:
    if ranks <= 1:
        return 0.0
    return 2 * (ranks - 1) / ranks * nbytes / link.bandwidth + 2 * (ranks - 1) * link.latency_s


class _Layout:
    """Rank -> node under pipe-data-model order."""

    def __init__(self, nodes: tuple[PlacedNode, ...], plan: Placed3DPlan) -> None:
        self.node_of: list[int] = []
        for index, node in enumerate(nodes):
            self.node_of += [index] * node.devices
        world = plan.tp * plan.dp * plan.pp
        if world != len(self.node_of):
            raise ConfigError(
                f"a placed plan needs tp*dp*pp = devices: {plan.tp}*{plan.dp}*{plan.pp} = "
                f"{world}, but the nodes hold {len(self.node_of)}; change the degrees"
            )
        self.plan = plan

    def rank(self, stage: int, replica: int, shard: int) -> int:
        p = self.plan
        return shard + p.tp * (replica + p.dp * stage)

    def node(self, stage: int, replica: int, shard: int) -> int:
        return self.node_of[self.rank(stage, replica, shard)]


def _network_time(flows: list[tuple[int, int, float]], nodes: tuple[PlacedNode, ...]) -> float:
    """Concurrent transfers ``(from_node, to_node, bytes)``: inside a node each takes
    the per-device link; across nodes they share the sender's and receiver's network."""
    out = [0.0] * len(nodes)
    into = [0.0] * len(nodes)
    worst = 0.0
    for src, dst, nbytes in flows:
        if src == dst:
            worst = max(worst, nbytes / nodes[src].intra.bandwidth + nodes[src].intra.latency_s)
        else:
            out[src] += nbytes
            into[dst] += nbytes
    for i, node in enumerate(nodes):
        if out[i] or into[i]:
            worst = max(
                worst, max(out[i], into[i]) / node.network.bandwidth + node.network.latency_s
            )
    return worst


def predict_placed(
    layers: tuple[LayerProfile, ...],
    tp_allreduces: tuple[int, ...],
    nodes: tuple[PlacedNode, ...],
    plan: Placed3DPlan,
    *,
    tied_params: float = 0.0,
    precisions: Precisions = Precisions(),
) -> StepBreakdown:
    """Predicted step time of ``plan`` on ``nodes`` (see the module docstring).
    ``tp_allreduces[i]``: tensor-parallel all-reduces of layer ``i``'s output per
    micro-batch, forward and backward together (a Megatron block: 4).
    ``tied_params``: parameters of the first layer that the last layer shares (a GPT's
    tied embedding), all-reduced between the first and last stage when ``pp > 1``."""
    p = plan
    starts = list(p.stage_starts)
    if len(starts) != p.pp + 1 or starts[0] != 0 or starts[-1] != len(layers):
        raise ConfigError(
            f"stage_starts must hold pp+1 = {p.pp + 1} layer indices from 0 to "
            f"{len(layers)}, but got {starts}; give each stage's first layer and the end"
        )
    if any(a >= b for a, b in itertools.pairwise(starts)):
        raise ConfigError(
            f"stage_starts must increase (every stage holds a layer), but got {starts}"
        )
    if p.global_batch_size % (p.dp * p.microbatch_size):
        raise ConfigError(
            f"global_batch_size {p.global_batch_size} must be a multiple of dp * "
            f"microbatch_size = {p.dp * p.microbatch_size}; change the micro-batch size"
        )
    if len(tp_allreduces) != len(layers):
        raise ConfigError(
            f"tp_allreduces needs one count per layer ({len(layers)}), but got {len(tp_allreduces)}"
        )
    layout = _Layout(nodes, p)
    micro = p.global_batch_size // (p.dp * p.microbatch_size)
    b = p.microbatch_size
    stages = [range(p.stage_starts[k], p.stage_starts[k + 1]) for k in range(p.pp)]

    compute = []
    for k, units in enumerate(stages):
        here = {layout.node(k, r, m) for r in range(p.dp) for m in range(p.tp)}
        worst = 0.0
        for n in here:
            node = nodes[n]
            flops = sum(layers[u].flops for u in units) * b / (p.tp * node.flops)
            tp = sum(
                tp_allreduces[u] * _ring(layers[u].output_bytes * b, p.tp, node.intra)
                for u in units
            )
            worst = max(worst, flops + tp)
        compute.append(worst)

    transfer = []
    for k in range(p.pp - 1):
        last = layers[p.stage_starts[k + 1] - 1]
        whole = last.output_bytes * b
        forward, backward, gather = [], [], 0.0
        for r in range(p.dp):
            for m in range(p.tp):
                src, dst = layout.node(k, r, m), layout.node(k + 1, r, m)
                forward.append((src, dst, whole / p.tp))
                backward.append((dst, src, whole))
            if p.tp > 1:
                node = nodes[layout.node(k + 1, r, 0)]
                gather = max(gather, (p.tp - 1) / p.tp * whole / node.intra.bandwidth)
        transfer.append(_network_time(forward, nodes) + gather + _network_time(backward, nodes))

    per_stage = [
        compute[k] + (transfer[k - 1] if k else 0.0) + (transfer[k] if k < p.pp - 1 else 0.0)
        for k in range(p.pp)
    ]
    pipeline = sum(compute) + sum(transfer) + (micro - 1) * max(per_stage)

    # Data-parallel all-reduce of every group at once.
    out = [0.0] * len(nodes)
    inside = 0.0
    for k, units in enumerate(stages):
        params = sum(layers[u].params for u in units)
        if p.pp == 1:
            params -= tied_params  # one tensor when both ends share a stage
        nbytes = params / p.tp * precisions.gradient
        for m in range(p.tp):
            members = [layout.node(k, r, m) for r in range(p.dp)]
            if p.dp == 1:
                continue
            if len(set(members)) == 1:
                inside = max(inside, _ring(nbytes, p.dp, nodes[members[0]].intra))
            else:
                for n in set(members):
                    out[n] += 2 * (p.dp - 1) / p.dp * nbytes
    data_parallel = max(
        [inside]
        + [
            out[n] / nodes[n].network.bandwidth + 2 * (p.dp - 1) * nodes[n].network.latency_s
            for n in range(len(nodes))
            if out[n]
        ]
    )

    tied = 0.0
    if p.pp > 1 and tied_params:
        flows = [
            (
                layout.node(0, r, m),
                layout.node(p.pp - 1, r, m),
                tied_params / p.tp * precisions.tied_gradient,
            )
            for r in range(p.dp)
            for m in range(p.tp)
        ]
        tied = _network_time(flows + [(d, s, n) for s, d, n in flows], nodes)

    optimizer = 0.0
    for k, units in enumerate(stages):
        params = sum(layers[u].params for u in units) / p.tp
        slowest = min(
            nodes[layout.node(k, r, m)].memory_bandwidth for r in range(p.dp) for m in range(p.tp)
        )
        optimizer = max(optimizer, params * precisions.optimizer / slowest)
    return StepBreakdown(pipeline, data_parallel, tied, optimizer)
