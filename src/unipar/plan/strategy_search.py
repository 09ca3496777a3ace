"""Search the unified space for the fastest plan that fits.

Enumerates mesh factorisations (tp within a node, dividing what tensor parallelism must
divide; cp dividing the sequence) x data-parallel flavour (all-reduce, distributed
optimizer/ZeRO-1, ZeRO-2, ZeRO-3) x micro-batch size, and so the number of micro-batches
x pipeline schedule with its interleaving depth x recompute (none, selective,
selective_op, full);
sequence parallelism goes with every tp > 1 (it saves memory and time at the same
communication volume). ``Constraints.runtime_only`` leaves out what the runtime cannot
apply yet (:mod:`unipar.plan.runtime_support`). Layers are split into pipeline stages
by dynamic programming that minimises the slowest stage (the inter-operator pass of
Alpa, Zheng et al. 2022, Sec. 5; :mod:`unipar.plan.partition`). A plan is costed for memory
first, and for time only if it fits.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass

from unipar.analysis.profile import ModelProfile
from unipar.cluster.spec import AttentionKernel, ClusterSpec
from unipar.errors import ConfigError
from unipar.plan.cost import CostModel, Estimate, tensor_parallel_styles
from unipar.plan.partition import StagePartitions, max_pipeline_stages
from unipar.plan.representation import Mesh, PipelineSchedule, Plan, Recompute
from unipar.plan.runtime_support import LIVE_PLANNING_SKIPS, Feature

VIRTUAL_STAGES = (2, 3, 4, 6, 8)  # interleaving depths tried
RECOMPUTE_EVERY = (4, 2, 1)  # full recompute of every n-th layer, fewest layers first
# Op-level options: one that fits may still be slower than full recompute of a few layers.
_PARTIAL_OPS = (Recompute.SELECTIVE, Recompute.SELECTIVE_OP)
MAX_CP = 32
# Context parallelism is tried down to this many tokens per rank: below it a ring
# step's attention (which grows with the chunk squared) no longer hides the exchange
# of keys and values (which grows with the chunk), and data parallelism does better.
MIN_CP_CHUNK = 2048


@dataclass(frozen=True)
class Constraints:
    """Choices pinned by the user (``None``: searched). ``runtime_only``: only plans the
    runtime applies today (live planning for ``fit``); ``unipar plan`` for GPU clusters
    searches everything."""

    tp: int | None = None
    pp: int | None = None
    dp: int | None = None
    fsdp: int | None = None
    cp: int | None = None
    microbatch_size: int | None = None
    schedule: PipelineSchedule | None = None
    virtual_stages: int | None = None
    recompute: Recompute | None = None
    recompute_every: int | None = None
    sequence_parallel: bool | None = None
    distributed_optimizer: bool | None = None
    runtime_only: bool = False

    def allows(self, feature: Feature) -> bool:
        return not (self.runtime_only and feature in LIVE_PLANNING_SKIPS)


@dataclass(frozen=True)
class Candidate:
    plan: Plan
    estimate: Estimate


@dataclass(frozen=True)
class SearchResult:
    best: Candidate
    ranked: tuple[Candidate, ...]  # plans that fit, fastest first
    rejected: tuple[Candidate, ...]  # plans over memory, least over first
    evaluated: int
    search_time_s: float


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def context_parallel_sizes(profile: ModelProfile, fixed: Constraints) -> list[int]:
    """cp sizes worth trying: 1, and powers of two up to :data:`MAX_CP` whose load-balanced
    ring (2 x cp chunks per sequence) divides the sequence of a model with attention,
    leaving each rank at least :data:`MIN_CP_CHUNK` tokens."""
    if fixed.cp is not None:
        return [fixed.cp]
    seq = profile.attention_seq
    if not fixed.allows(Feature.CONTEXT_PARALLEL) or not seq or not profile.has_attention:
        return [1]
    return [
        c
        for c in (1, 2, 4, 8, 16, MAX_CP)
        if c == 1 or (seq % (2 * c) == 0 and seq // c >= MIN_CP_CHUNK)
    ]


def _meshes(
    profile: ModelProfile, cluster: ClusterSpec, batch: int, fixed: Constraints
) -> Iterator[tuple[Mesh, bool, bool]]:
    """(mesh, reshard after forward, distributed optimizer) of every candidate."""
    devices = cluster.num_devices
    pinned = [fixed.tp, fixed.pp, fixed.dp, fixed.fsdp]
    if all(v is not None for v in pinned):
        devices = fixed.tp * fixed.pp * fixed.dp * fixed.fsdp * (fixed.cp or 1)  # type: ignore[operator]
    cps = context_parallel_sizes(profile, fixed)
    stages = max_pipeline_stages(profile)
    for tp in _divisors(cluster.devices_per_node):
        if fixed.tp not in (None, tp) or devices % tp:
            continue
        if any(size % tp for _, size in profile.tp_divisibility):
            continue
        for pp in _divisors(devices // tp):
            if fixed.pp not in (None, pp) or pp > stages:
                continue
            for cp in cps:
                if (devices // (tp * pp)) % cp:
                    continue
                replicas = devices // (tp * pp * cp)
                if batch % replicas:
                    continue
                only_dp = (pp, tp, cp) == (1, 1, 1)
                for dp, fsdp, reshard, zero1 in _data_parallel_flavours(
                    replicas, cp, fixed, only_dp
                ):
                    yield Mesh(pp=pp, dp=dp, fsdp=fsdp, tp=tp, cp=cp), reshard, zero1


def _data_parallel_flavours(
    replicas: int, cp: int, fixed: Constraints, only_dp: bool
) -> list[tuple[int, int, bool, bool]]:
    """(dp, fsdp, reshard after forward, distributed optimizer): all-reduce, ZeRO-1
    (over dp x cp), ZeRO-2, ZeRO-3. ``only_dp``: no tp, pp or cp beside."""
    options = [(replicas, 1, True, False)]
    zero1 = (
        Feature.DATA_PARALLEL_DISTRIBUTED_OPTIMIZER if only_dp else Feature.DISTRIBUTED_OPTIMIZER
    )
    if replicas * cp > 1 and fixed.allows(zero1):
        options.append((replicas, 1, True, True))
    if replicas > 1:
        options += [(1, replicas, False, False), (1, replicas, True, False)]  # ZeRO-2, ZeRO-3
    return [
        option
        for option in options
        if fixed.dp in (None, option[0])
        and fixed.fsdp in (None, option[1])
        and fixed.distributed_optimizer in (None, option[3])
    ]


def _schedules(mesh: Mesh, profile: ModelProfile, m: int, fixed: Constraints):  # type: ignore[no-untyped-def]
    if mesh.pp == 1:
        yield PipelineSchedule.ONE_F_ONE_B, 1
        return
    for schedule in PipelineSchedule:
        if fixed.schedule not in (None, schedule):
            continue
        if schedule is PipelineSchedule.ONE_F_ONE_B and m < mesh.pp:
            continue  # 1F1B's warm-up needs a micro-batch per stage (as torch requires)
        if schedule is PipelineSchedule.GPIPE and m >= mesh.pp and fixed.schedule is None:
            continue  # 1F1B runs: the same time, and no more micro-batches in flight
        if schedule is not PipelineSchedule.INTERLEAVED_1F1B:
            if fixed.virtual_stages in (None, 1):
                yield schedule, 1
            continue
        for v in VIRTUAL_STAGES:
            # Megatron's interleaving needs m to be a multiple of pp.
            if fixed.virtual_stages not in (None, v):
                continue
            if mesh.pp * v <= max_pipeline_stages(profile) and m % mesh.pp == 0:
                yield schedule, v


def search(
    profile: ModelProfile,
    cluster: ClusterSpec,
    global_batch_size: int,
    constraints: Constraints | None = None,
    *,
    keep: int = 8,
) -> SearchResult:
    started = time.perf_counter()
    constraints = constraints or Constraints()
    check_constraints(profile, cluster, global_batch_size, constraints)
    model = CostModel(profile, cluster)
    styles = tensor_parallel_styles(profile)
    partitions: dict[tuple, tuple[list[list[int]], tuple[int, ...]]] = {}
    host_bound = cluster.device.host_op_s > 0  # partitions per micro-batch size
    splitter = StagePartitions(profile)
    fitting: list[tuple[float, Plan, list[list[int]]]] = []  # (step time, plan, stages)
    over: list[tuple[float, Plan, list[list[int]]]] = []  # (memory, plan, stages)
    capacity = cluster.device.memory_gib
    evaluated = 0
    recomputes = _recomputes(profile, cluster, constraints)
    for mesh, reshard, zero1 in _meshes(profile, cluster, global_batch_size, constraints):
        sp = mesh.tp > 1 and constraints.sequence_parallel is not False
        sp = sp and constraints.allows(Feature.SEQUENCE_PARALLEL)
        per_replica = global_batch_size // mesh.data_replicas
        tp_styles = styles if mesh.tp > 1 else ()
        for b in _divisors(per_replica):
            if constraints.microbatch_size not in (None, b):
                continue
            m = per_replica // b
            for schedule, v in _schedules(mesh, profile, m, constraints):
                for recompute, every in recomputes:
                    chunks = mesh.pp * v
                    key = (chunks, mesh.tp, recompute.value, every)  # str: hashed at C speed
                    if host_bound:
                        key += (b,)
                    if key not in partitions:
                        # stages balance one sample's layer times: the partition of a key
                        # serves every micro-batch size, except where the host's time per
                        # op sets a floor (an eager GPU), which does not grow with samples
                        unit = Plan(mesh=mesh, virtual_stages=v, recompute=recompute,
                                    recompute_every=every, sequence_parallel=sp,
                                    microbatch_size=b if host_bound else 1)
                        stages = splitter.split(model.layer_weights(unit), chunks)
                        partitions[key] = (stages, tuple(s[0] for s in stages[1:]))
                    stages, boundaries = partitions[key]
                    plan = Plan(
                        mesh=mesh,
                        microbatch_size=b,
                        num_microbatches=m,
                        schedule=schedule,
                        virtual_stages=v,
                        recompute=recompute,
                        recompute_every=every,
                        reshard_after_forward=reshard,
                        sequence_parallel=sp,
                        distributed_optimizer=zero1,
                        stage_boundaries=boundaries,
                        layer_tp=tp_styles,
                    )
                    # memory first: most plans of a large model do not fit, and need
                    # no time; each kept plan's whole estimate is made once, at the end
                    memory = model.memory(plan, stages)
                    evaluated += 1
                    if memory.total_gib > capacity:
                        over.append((memory.total_gib, plan, stages))
                        continue
                    fitting.append((model.time(plan, stages).total_s, plan, stages))
                    # The options after one that fits are slower: none before any
                    # recompute; full recompute of fewer layers before more.
                    if recompute not in _PARTIAL_OPS:
                        break
    fitting.sort(key=lambda found: found[0])
    over.sort(key=lambda found: found[0])
    ranked = tuple(Candidate(p, model.estimate(p, s)) for _, p, s in fitting[:keep])
    rejected = tuple(Candidate(p, model.estimate(p, s)) for _, p, s in over[:keep])
    if not ranked:
        raise _no_fit_error(profile, cluster, list(rejected), evaluated)
    return SearchResult(
        best=ranked[0],
        ranked=ranked,
        rejected=rejected,
        evaluated=evaluated,
        search_time_s=time.perf_counter() - started,
    )


def _recomputes(
    profile: ModelProfile, cluster: ClusterSpec, fixed: Constraints
) -> list[tuple[Recompute, int]]:
    """(recompute, every n-th layer) options worth costing, from the fastest: none;
    selective only where attention stores scores (the math path; under a flash kernel
    it saves nothing and costs a forward); torchtitan's op-level policy
    (selective_op) in models with blocks; full recompute of every 4th, 2nd, then
    every layer. A pinned option is costed whatever it saves."""
    stores_scores = cluster.device.attention is AttentionKernel.MATH and profile.has_attention
    options = [(Recompute.NONE, 1)]
    pinned = fixed.recompute is Recompute.SELECTIVE
    if (stores_scores or pinned) and fixed.allows(Feature.SELECTIVE_RECOMPUTE):
        options.append((Recompute.SELECTIVE, 1))
    if profile.num_blocks and fixed.allows(Feature.SELECTIVE_RECOMPUTE):
        options.append((Recompute.SELECTIVE_OP, 1))
    partial = fixed.allows(Feature.PARTIAL_RECOMPUTE) and profile.num_blocks > 1
    options += [(Recompute.FULL, n) for n in RECOMPUTE_EVERY if partial or n == 1]
    return [
        (recompute, every)
        for recompute, every in options
        if fixed.recompute in (None, recompute)
        and (recompute is not Recompute.FULL or fixed.recompute_every in (None, every))
    ]


def check_constraints(
    profile: ModelProfile, cluster: ClusterSpec, batch: int, fixed: Constraints
) -> None:
    if fixed.tp is not None:
        for what, size in profile.tp_divisibility:
            if size % fixed.tp:
                choices = [d for d in _divisors(size) if d <= cluster.devices_per_node]
                raise ConfigError(
                    f"`tp` must divide `{what}`, but got tp={fixed.tp}, {what}={size}; "
                    f"choose tp among {choices}"
                )
        if cluster.devices_per_node % fixed.tp:
            raise ConfigError(
                f"`tp` must divide the devices per node (a tensor-parallel group stays in "
                f"one node), but got tp={fixed.tp}, devices_per_node="
                f"{cluster.devices_per_node}; choose tp among "
                f"{_divisors(cluster.devices_per_node)}"
            )
    stages = max_pipeline_stages(profile)
    if fixed.pp is not None and fixed.pp > stages:
        raise ConfigError(
            f"pipeline stages are runs of whole blocks (layers with sub-layers), or of "
            f"layers where the model has fewer than two blocks, but got pp={fixed.pp} for a "
            f"model whose layers {[layer.name for layer in profile.layers]} allow "
            f"{stages} stage(s); choose pp <= {stages}, or use dp, fsdp or tp"
        )
    sizes = {"tp": fixed.tp, "pp": fixed.pp, "dp": fixed.dp, "fsdp": fixed.fsdp, "cp": fixed.cp}
    pinned = {k: v for k, v in sizes.items() if v is not None}
    used = 1
    for size in pinned.values():
        used *= size
    if used > cluster.num_devices:
        shown = " x ".join(f"{k}={v}" for k, v in pinned.items())
        raise ConfigError(
            f"the plan needs {used} devices ({shown}), but the cluster has "
            f"{cluster.num_devices} ({cluster.nodes} nodes x {cluster.devices_per_node}); "
            "use more nodes or smaller axes"
        )
    if fixed.cp is not None and fixed.cp > 1:
        seq = profile.attention_seq
        if not profile.has_attention or not seq or seq % (2 * fixed.cp):
            raise ConfigError(
                f"context parallelism splits each sequence into 2 x cp chunks over the "
                f"ranks of a model's attention, but got cp={fixed.cp} for a model with "
                f"sequence {seq} and{'' if profile.has_attention else ' no'} attention; "
                "choose cp=1 or a cp for which 2 x cp divides the sequence"
            )
    if len(set(pinned) - {"cp"}) == 4 or (len(set(pinned) - {"cp"}) == 3 and "fsdp" not in pinned):
        replicas = (fixed.dp or 1) * (fixed.fsdp or 1)
        if batch % replicas:
            raise ConfigError(
                f"the global batch must divide over the data replicas, but got "
                f"global_batch={batch}, dp x fsdp={replicas}"
            )


def _no_fit_error(
    profile: ModelProfile, cluster: ClusterSpec, over: list[Candidate], evaluated: int
) -> ConfigError:
    if not over:
        return ConfigError(
            f"no plan matches the constraints on {cluster.num_devices} devices "
            f"({evaluated} evaluated); relax --fix or change the cluster or batch"
        )
    least = over[0]
    need, have = least.estimate.memory.total_gib, cluster.device.memory_gib
    factor = need / have
    return ConfigError(
        f"the model ({profile.params / 1e9:.2f}B parameters) fits under no plan: the "
        f"smallest needs {need:.1f} GiB per device (plan tp={least.plan.mesh.tp}, "
        f"pp={least.plan.mesh.pp}, fsdp={least.plan.mesh.fsdp}, recompute="
        f"{least.plan.recompute.value}), {have:.1f} GiB available; use about "
        f"{factor:.1f}x more devices (e.g. {cluster.nodes * 2 ** max(1, int(factor).bit_length())} "
        "nodes), devices with more memory, or a smaller model or sequence"
    )
