"""Plans over heterogeneous clusters: uneven data-parallel shares and uneven pipeline stages.

Two shapes, searched together (the view of AMP, Li et al. 2022, and Sailor, Strati et
al. 2024, restricted to what the runtime applies):

- ``data_parallel``: every group holds whole replicas (tensor parallel of degree ``tp``
  inside one node of the group only, so TP never spans device types); the global batch's
  micro-batches go to replicas in proportion to their speed (water-filling: each replica
  gets ``floor(T / t_replica)`` micro-batches for the smallest step time ``T`` that
  covers the batch), and gradients are averaged with weights equal to the shares.
- ``pipeline``: one stage per group, the layers cut contiguously so that every stage
  takes about the same time (faster groups get more layers), within each stage's
  memory; the group's replicas split each micro-batch. Step time of a synchronous
  pipeline of ``S`` stages and ``M`` micro-batches: ``(M + S - 1) * max stage time``
  (GPipe, Huang et al. 2019; 1F1B has the same bubble, Narayanan et al. 2021).

Compute time of ``f`` FLOPs on a device: ``f / (peak * gemm_efficiency)`` (the device's
spec). Ring all-reduce of ``b`` bytes over ``n`` ranks: ``2 (n-1)/n * b / bandwidth +
2 (n-1) * latency`` (Patarasuk & Yuan 2009). Memory per device: weights, gradients and
Adam's two moments (``4 * bytes_per_element`` bytes per parameter, fp32 master weights
adding 4 more under bf16; Rajbhandari et al. 2020) over ``tp``, plus the activations of
the micro-batches in flight.
"""

from __future__ import annotations

import itertools
import json
import math
from dataclasses import asdict, dataclass, field
from enum import Enum
from typing import Any

from unipar.cluster.hetero import HeteroCluster, NodeGroup
from unipar.cluster.spec import GIB, LinkSpec
from unipar.errors import ConfigError, ResourceError
from unipar.plan.representation import Mesh, Plan


class HeteroKind(Enum):
    DATA_PARALLEL = "data_parallel"
    PIPELINE = "pipeline"


@dataclass(frozen=True)
class LayerProfile:
    """One layer's cost per sample: forward+backward FLOPs, parameters, the activation
    bytes kept for backward, and the bytes of its output (sent to the next stage)."""

    flops: float
    params: float
    activation_bytes: float
    output_bytes: float


def transformer_layers(
    *, hidden: int, layers: int, seq_len: int, vocab: int, bytes_per_element: int = 2
) -> tuple[LayerProfile, ...]:
    """Embedding, ``layers`` blocks and the output head of a GPT-style decoder.
    FLOPs per block and sample: ``3 * (24 s h^2 + 4 s^2 h)`` (forward, and backward at
    twice the forward; Narayanan et al. 2021, Sec. 5.1); activations ``s h (34 + 5 a s
    / h)`` bytes in 16-bit, taken with ``a s / h ~ 1`` (Korthikanti et al. 2022, Eq. 1)."""
    s, h = seq_len, hidden
    out = s * h * bytes_per_element
    block = LayerProfile(
        flops=3 * (24 * s * h * h + 4 * s * s * h),
        params=12 * h * h,
        activation_bytes=s * h * 39 * bytes_per_element / 2,
        output_bytes=out,
    )
    embed = LayerProfile(flops=0.0, params=vocab * h, activation_bytes=out, output_bytes=out)
    head = LayerProfile(
        flops=3 * 2 * s * h * vocab,
        params=vocab * h,
        activation_bytes=s * vocab * 4,
        output_bytes=s * vocab * 4,
    )
    return (embed, *([block] * layers), head)


@dataclass(frozen=True)
class GroupAssignment:
    """What one node group does: ``tp`` devices per replica, ``replicas`` replicas;
    data parallel: each replica's micro-batch count; pipeline: the stage index and
    its layers ``[first_layer, end_layer)``."""

    group: str
    device: str
    devices: int
    tp: int
    replicas: int
    microbatches: tuple[int, ...] = ()
    stage: int = 0
    first_layer: int = 0
    end_layer: int = 0
    memory_gib: float = 0.0
    step_compute_s: float = 0.0


@dataclass(frozen=True)
class HeteroPlan:
    kind: HeteroKind
    global_batch_size: int
    microbatch_size: int
    assignments: tuple[GroupAssignment, ...]
    predicted_step_s: float
    num_microbatches: int = 1  # pipeline: micro-batches per step

    @property
    def stage_boundaries(self) -> tuple[int, ...]:
        """First layer of stages 1..S-1 (pipeline plans)."""
        stages = sorted(self.assignments, key=lambda a: a.stage)
        return tuple(a.first_layer for a in stages[1:])

    @property
    def replica_samples(self) -> tuple[int, ...]:
        """Samples per data-parallel replica, in group order (data-parallel plans)."""
        return tuple(n * self.microbatch_size for a in self.assignments for n in a.microbatches)

    def to_plan(self) -> Plan:
        """The runtime's :class:`~unipar.plan.Plan` for this plan, for ``fit``: data
        parallel with uneven ``replica_samples`` (rank ``r`` is replica ``r`` in group
        order; replicas that take no samples are left out), or a pipeline with this
        plan's uneven ``stage_boundaries`` (one device per stage; layer indices as in
        the profiles given to :func:`plan_hetero`, so give those in the runtime model's
        layer order). Ranks follow this order; placing each rank on its group's devices
        is up to the cluster."""
        if any(a.tp > 1 for a in self.assignments):
            raise ConfigError(
                "HeteroPlan.to_plan: the runtime takes uneven shares and stages without "
                "tensor parallelism, but this plan has tp="
                f"{[a.tp for a in self.assignments]}; plan with tp=1 groups"
            )
        if self.kind is HeteroKind.DATA_PARALLEL:
            samples = tuple(n for n in self.replica_samples if n)
            return Plan(
                mesh=Mesh(dp=len(samples)),
                microbatch_size=self.microbatch_size,
                num_microbatches=max(samples) // self.microbatch_size,
                replica_samples=samples,
            )
        if any(a.replicas != 1 for a in self.assignments):
            raise ConfigError(
                "HeteroPlan.to_plan: the runtime's pipeline has one device per stage, but "
                f"this plan's stages have {[a.replicas for a in self.assignments]} replicas; "
                "use groups of one device each"
            )
        return Plan(
            mesh=Mesh(pp=len(self.assignments)),
            microbatch_size=self.microbatch_size,
            num_microbatches=self.num_microbatches,
            stage_boundaries=self.stage_boundaries,
        )

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["kind"] = self.kind.value
        return data

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), sort_keys=True)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> HeteroPlan:
        try:
            values = dict(data)
            values["kind"] = HeteroKind(values["kind"])
            values["assignments"] = tuple(
                GroupAssignment(**{**a, "microbatches": tuple(a.get("microbatches", ()))})
                for a in values["assignments"]
            )
            return cls(**values)
        except (KeyError, TypeError, ValueError) as error:
            raise ConfigError(
                f"not a heterogeneous plan ({error}); pass the JSON of HeteroPlan.to_json()"
            ) from None

    @classmethod
    def from_json(cls, text: str) -> HeteroPlan:
        return cls.from_dict(json.loads(text))


@dataclass(frozen=True)
class _Replica:
    """One group's replica type at one tp degree: seconds per sample, memory."""

    group: NodeGroup
    tp: int
    replicas: int
    sample_s: float
    fixed_gib: float  # weights, gradients, optimizer state per device
    activation_gib: float  # per sample per device
    capacity_gib: float = field(default=0.0)


def _bytes_per_param(group: NodeGroup) -> int:
    b = group.device.bytes_per_element
    return 4 * b + (4 if b == 2 else 0)


def _compute_s(flops: float, group: NodeGroup, tp: int) -> float:
    d = group.device
    return flops / (tp * d.peak_flops * d.gemm_efficiency)


def _tp_comm_s(layers: tuple[LayerProfile, ...], group: NodeGroup, tp: int) -> float:
    """Megatron TP: two all-reduces of the layer output forward and two backward per
    block (Shoeybi et al. 2019), per sample."""
    if tp == 1:
        return 0.0
    link = group.intra_node
    return sum(4 * _ring_s(layer.output_bytes, tp, link) for layer in layers[1:-1])


def _ring_s(nbytes: float, ranks: int, link: LinkSpec) -> float:
    if ranks <= 1:
        return 0.0
    return 2 * (ranks - 1) / ranks * nbytes / link.bandwidth + 2 * (ranks - 1) * link.latency_s


def _tp_degrees(group: NodeGroup) -> list[int]:
    per_node = group.cluster.devices_per_node
    return [t for t in (1, 2, 4, 8) if per_node % t == 0]


def _replica(group: NodeGroup, tp: int, layers: tuple[LayerProfile, ...]) -> _Replica:
    flops = sum(layer.flops for layer in layers)
    params = sum(layer.params for layer in layers)
    act = sum(layer.activation_bytes for layer in layers)
    return _Replica(
        group=group,
        tp=tp,
        replicas=group.count // tp,
        sample_s=_compute_s(flops, group, tp) + _tp_comm_s(layers, group, tp),
        fixed_gib=params * _bytes_per_param(group) / tp / GIB,
        activation_gib=act / tp / GIB,
        capacity_gib=group.device.memory_gib - group.device.reserved_gib,
    )


def water_fill(times: list[float], counts: list[int], total: int) -> tuple[float, list[int]]:
    """Split ``total`` micro-batches over replica types (``counts[i]`` replicas taking
    ``times[i]`` s each per micro-batch) to minimise the slowest replica's time.
    Returns that time and each type's micro-batches per replica (first replicas of a
    type take one more where the total asks)."""
    lo, hi = 0.0, max(times) * total
    for _ in range(60):
        mid = (lo + hi) / 2
        if sum(c * math.floor(mid / t + 1e-9) for t, c in zip(times, counts, strict=True)) >= total:
            hi = mid
        else:
            lo = mid
    per = [math.floor(hi / t + 1e-9) for t in times]
    return hi, per


def _dp_candidate(
    replicas: list[_Replica],
    layers: tuple[LayerProfile, ...],
    gbs: int,
    mb: int,
    between: LinkSpec,
) -> tuple[float, list[tuple[_Replica, tuple[int, ...]]]] | None:
    usable = [r for r in replicas if r.fixed_gib + r.activation_gib * mb <= r.capacity_gib]
    if not usable:
        return None
    total = gbs // mb
    times = [r.sample_s * mb for r in usable]
    _, per = water_fill(times, [r.replicas for r in usable], total)
    # Hand out exactly ``total``: fastest replicas first, ``per`` each at most.
    left = total
    counts: dict[int, tuple[int, ...]] = {}
    for i in sorted(range(len(usable)), key=lambda i: times[i]):
        take = []
        for _ in range(usable[i].replicas):
            take.append(min(per[i], left))
            left -= take[-1]
        counts[i] = tuple(take)
    shares = [(r, counts[i]) for i, r in enumerate(usable)]
    return _dp_step_s(shares, layers, mb, between), shares


def _dp_step_s(
    shares: list[tuple[_Replica, tuple[int, ...]]],
    layers: tuple[LayerProfile, ...],
    mb: int,
    between: LinkSpec,
) -> float:
    """The slowest replica's compute, then the ring all-reduce of the gradients over
    every replica that takes part."""
    compute = max(r.sample_s * mb * max(counts) for r, counts in shares)
    taking = [(r, c) for r, c in shares if any(c)]
    ranks = sum(len([n for n in c if n]) for _, c in taking)
    groups = {r.group.name for r, _ in taking}
    link = between if len(groups) > 1 else taking[0][0].group.inter_node
    grad_bytes = sum(x.params for x in layers) * taking[0][0].group.device.bytes_per_element
    return compute + _ring_s(grad_bytes, ranks, link)


def predict_data_parallel(
    layers: tuple[LayerProfile, ...],
    cluster: HeteroCluster,
    microbatches: tuple[tuple[int, ...], ...],
    microbatch_size: int,
) -> float:
    """Predicted step time of a data-parallel plan with the given micro-batch counts
    per replica of each group (tp=1), e.g. an even split to compare with."""
    shares = [
        (_replica(g, 1, layers), counts)
        for g, counts in zip(cluster.groups, microbatches, strict=True)
    ]
    return _dp_step_s(shares, layers, microbatch_size, cluster.link_between_groups)


def _partition(
    layers: tuple[LayerProfile, ...], stages: list[_Replica], mb: int, in_flight: list[int]
) -> tuple[float, list[int]] | None:
    """Contiguous cut of ``layers`` into ``len(stages)`` stages minimising the slowest
    stage's micro-batch time within each stage's memory: bisection on that time, each
    stage greedily taking layers while it stays under it (exact for contiguous cuts)."""
    unit = [
        (layer, [s.sample_s / max(1, sum(x.flops for x in layers)) for s in stages])
        for layer in layers
    ]

    def fits(limit: float) -> list[int] | None:
        starts, index = [], 0
        for k, stage in enumerate(stages):
            starts.append(index)
            per_replica = math.ceil(mb / stage.replicas)
            t = mem = 0.0
            while index < len(layers):
                layer = layers[index]
                dt = unit[index][1][k] * layer.flops * per_replica
                dm = (
                    layer.params * _bytes_per_param(stage.group) / stage.tp
                    + layer.activation_bytes * per_replica * in_flight[k] / stage.tp
                ) / GIB
                if t + dt > limit or mem + dm > stage.capacity_gib:
                    break
                t, mem, index = t + dt, mem + dm, index + 1
            if index == starts[-1] and index < len(layers):
                return None  # an empty stage: every stage holds at least one layer
        return starts if index == len(layers) else None

    total = sum(s.sample_s for s in stages) * mb
    lo, hi = 0.0, total
    if fits(hi) is None:
        return None
    for _ in range(50):
        mid = (lo + hi) / 2
        if fits(mid) is None:
            lo = mid
        else:
            hi = mid
    starts = fits(hi)
    return (hi, starts) if starts is not None else None


def _pipeline_candidate(
    order: tuple[_Replica, ...],
    layers: tuple[LayerProfile, ...],
    gbs: int,
    mb: int,
    between: LinkSpec,
) -> tuple[float, list[int], float] | None:
    stages = list(order)
    if len(stages) < 2 or len(layers) < len(stages) or any(s.replicas > mb for s in stages):
        return None
    micro = gbs // mb
    in_flight = [min(micro, len(stages) - k) for k in range(len(stages))]  # 1F1B
    cut = _partition(layers, stages, mb, in_flight)
    if cut is None:
        return None
    stage_s, starts = cut
    ends = [*starts[1:], len(layers)]
    p2p = sum(layers[e - 1].output_bytes * mb / between.bandwidth for e in ends[:-1])
    grad = max(
        _ring_s(
            sum(x.params for x in layers[a:e]) * s.group.device.bytes_per_element,
            s.replicas,
            s.group.inter_node if s.group.cluster.nodes > 1 else s.group.intra_node,
        )
        for s, a, e in zip(stages, starts, ends, strict=True)
    )
    return (micro + len(stages) - 1) * stage_s + 2 * p2p + grad, starts, stage_s


def plan_hetero(
    layers: tuple[LayerProfile, ...],
    cluster: HeteroCluster,
    global_batch_size: int,
    *,
    kinds: tuple[HeteroKind, ...] = (HeteroKind.DATA_PARALLEL, HeteroKind.PIPELINE),
    microbatch_sizes: tuple[int, ...] | None = None,
) -> HeteroPlan:
    """The fastest predicted plan of ``kinds`` for ``layers`` on ``cluster``."""
    if global_batch_size < 1:
        raise ConfigError(f"global_batch_size must be >= 1, but got {global_batch_size}")
    sizes = microbatch_sizes or tuple(
        m for m in range(1, global_batch_size + 1) if global_batch_size % m == 0
    )
    per_group = [[_replica(g, t, layers) for t in _tp_degrees(g)] for g in cluster.groups]
    between = cluster.link_between_groups
    best: HeteroPlan | None = None
    for mb in sizes:
        if global_batch_size % mb:
            raise ConfigError(
                f"micro-batch size {mb} must divide global_batch_size {global_batch_size}"
            )
        for choice in itertools.product(*per_group):
            if HeteroKind.DATA_PARALLEL in kinds:
                found = _dp_candidate(list(choice), layers, global_batch_size, mb, between)
                if found and (best is None or found[0] < best.predicted_step_s):
                    best = _dp_plan(found, global_batch_size, mb)
            if HeteroKind.PIPELINE in kinds and len(choice) > 1:
                orders = itertools.permutations(choice) if len(choice) <= 4 else [tuple(choice)]
                for order in orders:
                    got = _pipeline_candidate(order, layers, global_batch_size, mb, between)
                    if got and (best is None or got[0] < best.predicted_step_s):
                        best = _pipeline_plan(order, got, layers, global_batch_size, mb)
    if best is None:
        raise ResourceError(_too_small(layers, cluster))
    return best


def _assignment(r: _Replica, **placement: Any) -> GroupAssignment:
    """``r``'s device group as a plan assigns it; ``placement``: its batch shares (data
    parallel) or its stage and layers (pipeline)."""
    return GroupAssignment(
        group=r.group.name,
        device=r.group.device.name,
        devices=r.group.count,
        tp=r.tp,
        replicas=r.replicas,
        **placement,
    )


def _dp_plan(
    found: tuple[float, list[tuple[_Replica, tuple[int, ...]]]], gbs: int, mb: int
) -> HeteroPlan:
    step, shares = found
    return HeteroPlan(
        kind=HeteroKind.DATA_PARALLEL,
        global_batch_size=gbs,
        microbatch_size=mb,
        predicted_step_s=step,
        assignments=tuple(
            _assignment(
                r,
                microbatches=counts,
                memory_gib=round(r.fixed_gib + r.activation_gib * mb, 3),
                step_compute_s=r.sample_s * mb * max(counts),
            )
            for r, counts in shares
        ),
    )


def _pipeline_plan(
    order: tuple[_Replica, ...],
    got: tuple[float, list[int], float],
    layers: tuple[LayerProfile, ...],
    gbs: int,
    mb: int,
) -> HeteroPlan:
    step, starts, _ = got
    ends = [*starts[1:], len(layers)]
    return HeteroPlan(
        kind=HeteroKind.PIPELINE,
        global_batch_size=gbs,
        microbatch_size=mb,
        num_microbatches=gbs // mb,
        predicted_step_s=step,
        assignments=tuple(
            _assignment(r, stage=k, first_layer=a, end_layer=e)
            for k, (r, a, e) in enumerate(zip(order, starts, ends, strict=True))
        ),
    )


def _too_small(layers: tuple[LayerProfile, ...], cluster: HeteroCluster) -> str:
    need = []
    for g in cluster.groups:
        r = _replica(g, max(_tp_degrees(g)), layers)
        need.append(
            f"group {g.name!r} ({g.count}x {g.device.name}): a whole replica at tp={r.tp} needs "
            f"{r.fixed_gib + r.activation_gib:.1f} GiB per device, it has {r.capacity_gib:.1f}"
        )
    return (
        "no plan fits the model on this cluster: every group is too small for the model, "
        "and no pipeline over the groups fits either; "
        + "; ".join(need)
        + ". Add devices with more memory, or use a smaller model or micro-batch"
    )
