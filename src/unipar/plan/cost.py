"""The cost model: predicted step time and memory per device of a plan (the memory
arithmetic is :mod:`unipar.plan.memory`). Pure arithmetic.

Sources of the formulas:
- compute: FLOPs over peak x GEMM efficiency, plus a fixed cost per op; memory-bound ops
  as bytes over memory bandwidth (the roofline model, Williams et al. 2009);
- backward = 2 x forward; full recompute adds one forward (Narayanan et al. 2021, Sec. 5.1);
- collectives: alpha-beta rings, hierarchical over nodes, as the device's collective
  library runs them (:mod:`unipar.plan.collectives`);
- tensor parallel: 2 all-reduces of the layer output per transformer block in forward and
  2 in backward (Shoeybi et al. 2019, Fig. 4), and where the device waits for each
  collective (CPU workers) one per column-wise layer in backward, as the runtime's
  DTensor layers run them (:func:`block_tp_collectives`); pipeline sends are scattered
  over the tp ranks (Narayanan et al. 2021, Sec. 4.1);
- pipeline: (m + (p-1)/v) microbatch times for 1F1B with v virtual stages, (m + p - 1)
  for GPipe (Narayanan et al. 2021, Sec. 2.2); in-flight microbatches p for 1F1B,
  p(1 + (p-1)/(pv)) interleaved, m for GPipe;
- ZeRO-3 gathers weights in forward and backward (1.5x the all-reduce traffic)
  (Rajbhandari et al. 2020);
- data-parallel gradient sync overlaps with the backward of the last microbatch where the
  device computes and communicates at once (GPUs; not one-thread CPU workers) (DDP's
  bucketed all-reduce, Li et al. 2020);
- attention as the device runs it: the math path materialises and stores the scores; a
  flash kernel stores none, computes half the scores under a causal mask, and in
  backward recomputes them (5 products against the forward's 2: 2.5x the forward)
  (Dao et al. 2022; Dao 2023);
- sequence parallelism divides the activations and memory-bound ops of the full-width
  parts (norms, dropout, residuals) by tp and replaces each all-reduce by a
  reduce-scatter and an all-gather of the same volume (Korthikanti et al. 2022, Sec. 4.2);
  on CPU workers one all-gather per column-wise layer and one per block boundary
  (:func:`block_tp_collectives`), and the framework's own time of its layouts per
  split module and pass (``sequence_parallel_op_overhead_s``, calibrated);
  selective recompute stores no attention core and runs its forward again (Sec. 5);
  torchtitan's op-level policy (selective_op) saves the attention kernel's output and
  every other matrix product's, and runs the other products and the memory-bound ops
  again (torchtitan, ``_save_list`` in its llama3 ``parallelize.py``);
- context parallelism splits every sample's sequence over cp ranks (FLOPs, activations
  and messages / cp); keys and values are all-gathered once per pass, behind the
  local chunk's attention only (PyTorch's default rotate method; Llama 3, Dubey et al.
  2024, Sec. 3.3.2; ring attention, Liu et al. 2023); gradients reduce over dp x cp;
- eager execution (one kernel per op) takes EAGER_SLOWDOWN times the fused kernels'
  compute time in bf16 (torchtitan's eager and compiled runs of one plan; ``Kernels``),
  its extra share scaled by bytes per element and the precision's peak in another
  (``DeviceSpec.compute_slowdown``); on an eager GPU the host issues every op
  (``EAGER_HOST_OP_S``, :func:`host_ops`) while the device runs ahead of it (PyTorch's
  asynchronous CUDA execution), so a layer's pass, and the optimizer step per parameter
  tensor, take at least the host's time, measured on a lent H100 host
  (docs/planner-learning.md);
- a distributed optimizer (ZeRO-1) shards the optimizer state over dp x cp and turns the
  gradient all-reduce into a reduce-scatter and an all-gather of the weights
  (Rajbhandari et al. 2020; Megatron-LM's distributed optimizer); over dp alone it is
  the runtime's, which all-reduces the gradients as DDP does and then broadcasts each
  parameter from the rank that updated it
  (:mod:`unipar.runtime.parallel.distributed_optimizer`);
- FSDP under gradient accumulation syncs on the last micro-batch only (one
  reduce-scatter per unit and step; ZeRO-2 keeps the gathered weights until then), as
  the runtime does (``set_requires_gradient_sync``); the framework's own time is per
  unit and micro-batch (hooks) and per step (buffers, the optimizer on DTensors).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from unipar.analysis.profile import LayerKind, LayerProfile, ModelProfile
from unipar.cluster.spec import OPTIMIZER_HOST_OPS_PER_TENSOR, AttentionKernel, ClusterSpec
from unipar.plan.collectives import (
    Axes,
    Collective,
    group_span,
    owner_broadcasts_time,
    ring_time,
)
from unipar.plan.fsdp_framework import fsdp_framework_time, fsdp_gathers, fsdp_units
from unipar.plan.memory import (
    MemoryBreakdown,
    MemoryTerms,
    RankLoads,
    in_flight_microbatches,
    memory_terms,
    op_level_saved_elems,
    rank_memory,
    stores_scores,
)
from unipar.plan.representation import (
    Mesh,
    MeshAxis,
    PipelineSchedule,
    Plan,
    Recompute,
    TensorParallelStyle,
)
from unipar.plan.tp_collectives import (
    block_tp_collectives,
    sequence_parallel_partial_grads,
    tp_allreduces,
)

DDP_BUCKET_BYTES = 25 * 2**20  # torch DistributedDataParallel's default bucket_cap_mb
ADAM_STEP_BYTES_PER_PARAM = 30  # read weights, grads, master, m, v; write weights, master, m, v
FLASH_BACKWARD = 2.5  # flash backward: 5 products (scores recomputed) against 2 forward


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
class Estimate:
    time: TimeBreakdown
    memory: MemoryBreakdown
    fits: bool
    model_flops: float  # forward + backward FLOPs of one step, no recompute

    @property
    def step_time_s(self) -> float:
        return self.time.total_s


def _roofline(
    matmuls: tuple[tuple[float, float, float], ...], samples: float, tp: int, cluster: ClusterSpec
) -> float:
    device = cluster.device
    rate = device.peak_flops * device.gemm_efficiency
    bpe, bandwidth = device.bytes_per_element, device.memory_bandwidth
    return sum(
        max(flops * samples / tp / rate, (act * samples + weights) / tp * bpe / bandwidth)
        for flops, act, weights in matmuls
    )


def layer_forward_time(
    layer: LayerProfile,
    samples: float,
    tp: int,
    cluster: ClusterSpec,
    *,
    sequence_parallel: bool = False,
) -> float:
    """Roofline per matrix product (the slower of its FLOPs and its bytes), bytes for the
    memory-bound rest, and a fixed cost per op; the attention core apart
    (:func:`attention_time`)."""
    ops = layer.matmul_ops - len(layer.attention_matmuls) + layer.memory_ops
    return _forward_time(layer, layer.matmuls, ops, (samples, tp, sequence_parallel), cluster)


def op_level_recompute_time(
    layer: LayerProfile, samples: float, tp: int, cluster: ClusterSpec, sequence_parallel: bool
) -> float:
    """The forward work a block runs again under torchtitan's op-level selective
    recompute (``selective_op``): every second matrix product (the 2nd, 4th, ...: its
    policy counts ``mm`` calls and saves the odd ones) and every memory-bound
    (element-wise, norm) op; the attention kernel's output is saved."""
    if layer.kind is not LayerKind.BLOCK:
        return 0.0
    again = layer.matmuls[1::2]
    ops = len(again) + layer.memory_ops
    return _forward_time(layer, again, ops, (samples, tp, sequence_parallel), cluster)


def _forward_time(
    layer: LayerProfile,
    matmuls: tuple[tuple[float, float, float], ...],
    ops: int,
    shape: tuple[float, int, bool],
    cluster: ClusterSpec,
) -> float:
    """``matmuls`` by roofline, the layer's memory-bound ops by bytes, ``ops`` launches;
    ``shape``: (samples, tp, sequence parallel)."""
    samples, tp, sequence_parallel = shape
    device = cluster.device
    replicated = layer.moved_elems_replicated / (tp if sequence_parallel else 1)
    moved = (layer.moved_elems_sharded / tp + replicated) * samples
    memory = moved * device.bytes_per_element / device.memory_bandwidth
    gemm = _roofline(matmuls, samples, tp, cluster)
    return gemm + memory + ops * device.kernel_overhead_s


def attention_time(
    layer: LayerProfile, samples: float, plan: Plan, cluster: ClusterSpec, causal: bool
) -> float:
    """Seconds of the attention core for ``samples`` samples on one rank (heads split
    over tp, queries over cp): forward, backward and any recompute of it."""
    if not layer.attention_matmuls:
        return 0.0
    device, tp = cluster.device, plan.mesh.tp
    again = attention_recomputed(plan, device.attention)
    if device.attention is AttentionKernel.FLASH:
        rate = device.peak_flops * (device.attention_efficiency or device.gemm_efficiency)
        flops = layer.attention_flops * samples / tp * (0.5 if causal else 1.0)
        passes = 1 + FLASH_BACKWARD + again
        return passes * (flops / rate + device.kernel_overhead_s)
    moved = layer.attention_moved_elems * samples / tp * device.bytes_per_element
    forward = (
        _roofline(layer.attention_matmuls, samples, tp, cluster)
        + moved / device.memory_bandwidth
        + len(layer.attention_matmuls) * device.kernel_overhead_s
    )
    return (3 + again) * forward


def host_ops(layer: LayerProfile, plan: Plan, kernel: AttentionKernel) -> float:
    """The ops the host issues for one micro-batch through ``layer``: each of its ops in
    forward (1), backward (2, the model's 1:2) and any recompute; selective recompute's
    attention core again (one fused kernel, or the math path's products), and the
    op-level policy's products and memory-bound ops again (:func:`op_level_recompute_time`)."""
    ops = (3 + plan.recomputed_fraction) * (layer.matmul_ops + layer.memory_ops)
    again = attention_recomputed(plan, kernel) - plan.recomputed_fraction
    if again > 0 and layer.attention_matmuls:
        ops += again * (1 if kernel is AttentionKernel.FLASH else len(layer.attention_matmuls))
    if plan.recompute is Recompute.SELECTIVE_OP and layer.kind is LayerKind.BLOCK:
        ops += len(layer.matmuls[1::2]) + layer.memory_ops
    return ops


def attention_recomputed(plan: Plan, kernel: AttentionKernel) -> float:
    """How many times per step the attention core's forward runs again: selective
    recompute runs it again; full, in the layers that recompute; the op-level policy
    saves a fused kernel's output but not the math path's products."""
    selective = plan.recompute is Recompute.SELECTIVE or (
        plan.recompute is Recompute.SELECTIVE_OP and kernel is AttentionKernel.MATH
    )
    return 1.0 if selective else plan.recomputed_fraction


def tensor_parallel_styles(profile: ModelProfile) -> tuple[TensorParallelStyle, ...]:
    """Megatron-style splits: blocks by heads and MLP width, the largest embedding table
    and the output projection by vocabulary, the rest replicated. A layer of several
    tables (BERT's word, position and token-type embeddings with a norm) stays
    replicated, and so does a small head (a classifier's: less than a quarter of the
    token embedding's parameters), which a split would only add an all-gather to."""
    embeddings = [x for x in profile.layers if x.kind is LayerKind.EMBEDDING]
    tables = [x for x in embeddings if x.splittable_modules == 1]
    token_embedding = max(tables, key=lambda x: x.params, default=None)
    large_head = max((x.params for x in embeddings), default=0) / 4
    styles = []
    for layer in profile.layers:
        if layer.kind is LayerKind.BLOCK:
            styles.append(TensorParallelStyle.MEGATRON)
        elif layer is token_embedding or (
            # params 0: its weight is tied to (and counted with) the token embedding
            layer.kind is LayerKind.HEAD and (layer.params == 0 or layer.params >= large_head)
        ):
            styles.append(TensorParallelStyle.VOCAB)
        else:
            styles.append(TensorParallelStyle.REPLICATE)
    return tuple(styles)


def layer_time(
    layer: LayerProfile,
    plan: Plan,
    cluster: ClusterSpec,
    style: TensorParallelStyle = TensorParallelStyle.REPLICATE,
    causal: bool = True,
) -> tuple[float, float]:
    """(compute, tp and cp communication) seconds of one microbatch through ``layer`` on
    one rank: forward, backward and, with full recompute, the forward again. Under
    tensor parallelism a split layer also pays the framework's cost per split module
    and pass (more of it with sequence parallelism: its layouts' redistributions);
    under context parallelism each rank takes 1/cp of every sequence."""
    tp, cp = plan.mesh.tp, plan.mesh.cp
    samples = plan.microbatch_size / cp
    passes = 3 + plan.recomputed_fraction
    sp = plan.sequence_parallel and tp > 1
    attention = attention_time(layer, samples, plan, cluster, causal)
    compute = passes * layer_forward_time(layer, samples, tp, cluster, sequence_parallel=sp)
    compute += attention
    if plan.recompute is Recompute.SELECTIVE_OP:
        compute += op_level_recompute_time(layer, samples, tp, cluster, sp)
    compute *= cluster.device.compute_slowdown
    # An eager GPU waits for the host where its kernels are shorter than the host's time
    # to issue them (EAGER_HOST_OP_S): the pass takes the longer of the two.
    device = cluster.device
    compute = max(compute, host_ops(layer, plan, device.attention) * device.host_op_s)
    if tp > 1 and style is not TensorParallelStyle.REPLICATE:
        split = layer.splittable_modules if style is TensorParallelStyle.MEGATRON else 1
        per_op = cluster.device.sharded_op_overhead_s
        if sp:
            per_op += cluster.device.sequence_parallel_op_overhead_s
        compute += passes * split * per_op
    bpe = cluster.device.bytes_per_element
    output = layer.output_elems * samples * bpe
    mesh = plan.mesh
    if layer.kind is LayerKind.BLOCK:
        # Each collective of a split block moves one activation of the residual width;
        # forward runs again in the layers that recompute.
        forward_passes = 1 + plan.recomputed_fraction
        comm = sum(
            (forward_passes * forward + backward)
            * ring_time(output, mesh, MeshAxis.TP, cluster, collective=collective)
            for collective, forward, backward in block_tp_collectives(
                layer, sp, cluster.device.overlaps_communication
            )
        )
    else:
        one = ring_time(output, mesh, MeshAxis.TP, cluster, collective=Collective.ALL_REDUCE)
        comm = tp_allreduces(layer) * (2 + plan.recomputed_fraction) * one
    if cp > 1 and layer.attention_kv_elems:
        # Forward gathers keys and values; backward gathers them and reduces their
        # gradients. Each gather overlaps the local chunk's attention only (1/cp of it):
        # the other chunks wait for it (PyTorch's default, _AllGatherRotater; Llama 3's
        # all-gather context parallelism, Dubey et al. 2024, Sec. 3.3.2).
        chunk = layer.attention_kv_elems * samples / tp * bpe
        step = ring_time(chunk * cp, mesh, MeshAxis.CP, cluster, collective=Collective.ALL_GATHER)
        kv_passes = 1 + 2 + attention_recomputed(plan, cluster.device.attention)
        comm += max(0.0, kv_passes * step - attention / cp)
    return compute, comm


class CostModel:
    """:func:`estimate` for many plans of one model on one cluster: layer times are
    computed once per distinct layer and (microbatch, tp, recompute)."""

    def __init__(self, profile: ModelProfile, cluster: ClusterSpec) -> None:
        self.profile, self.cluster = profile, cluster
        self.forward_flops = profile.forward_flops
        # Layers that cost the same (repeated blocks: all but the name) are costed once.
        index: dict[LayerProfile, int] = {}
        self.unique: list[LayerProfile] = []
        self.layer_index: list[int] = []
        styles = tensor_parallel_styles(profile)
        self.unique_styles: list[TensorParallelStyle] = []
        for layer, style in zip(profile.layers, styles, strict=True):
            costs = replace(layer, name="")
            if (costs, style) not in index:
                index[costs, style] = len(self.unique)
                self.unique.append(layer)
                self.unique_styles.append(style)
            self.layer_index.append(index[costs, style])
        self._times: dict[tuple, tuple[np.ndarray, np.ndarray]] = {}
        self._loads: dict[tuple, RankLoads] = {}
        # Plans of a search share their stages (lists the search keeps): their loads are
        # found by the list's identity first, the list held so its id stays its own.
        self._loads_of: dict[int, tuple[list[list[int]], int, RankLoads]] = {}
        self._ranks: dict[tuple[int, int], _RankTimes] = {}
        self._memory: dict[tuple, MemoryTerms] = {}
        self._rings: dict[tuple, float] = {}
        self._weights: dict[int, list[float]] = {}  # by the identity of kept layer times
        self.is_block = np.array([x.kind is LayerKind.BLOCK for x in self.unique], dtype=float)
        self.param_tensors = np.array([x.param_tensors for x in self.unique], dtype=float)
        self.partial_grads = np.array(
            [sequence_parallel_partial_grads(x) for x in self.unique], dtype=float
        )

    def layer_times(self, plan: Plan) -> tuple[np.ndarray, np.ndarray]:
        mesh = plan.mesh
        key = (
            plan.microbatch_size,
            mesh.tp,
            mesh.cp,
            plan.recompute,
            plan.recompute_every,
            plan.sequence_parallel,
        )
        if mesh.cp > 1:  # the key-value ring's links depend on where the cp group lies
            key += (group_span(mesh, MeshAxis.CP, self.cluster.devices_per_node),)
        if key not in self._times:
            causal = self.profile.causal_attention
            pairs = [
                layer_time(layer, plan, self.cluster, style, causal)
                for layer, style in zip(self.unique, self.unique_styles, strict=True)
            ]
            self._times[key] = (np.array([p[0] for p in pairs]), np.array([p[1] for p in pairs]))
        return self._times[key]

    def layer_weights(self, plan: Plan) -> list[float]:
        """Each layer's (compute + communication) seconds under ``plan``, in layer order:
        what pipeline stages balance (one list per layer times, kept: the same list
        for plans that share them)."""
        compute, comm = self.layer_times(plan)
        weights = self._weights.get(id(compute))
        if weights is None:
            per_unique = compute + comm
            weights = self._weights[id(compute)] = [float(per_unique[i]) for i in self.layer_index]
        return weights

    def rank_loads(self, stages: list[list[int]], pp: int) -> RankLoads:
        seen = self._loads_of.get(id(stages))
        if seen is not None and seen[0] is stages and seen[1] == pp:
            return seen[2]
        key = (pp, tuple(s[0] for s in stages), len(stages))
        if key not in self._loads:
            counts = np.zeros((pp, len(self.unique)))
            for chunk, indices in enumerate(stages):
                for i in indices:
                    counts[chunk % pp, self.layer_index[i]] += 1
            column = np.array
            u = self.unique
            params = column([x.params for x in u], dtype=float)
            kept = column([x.output_elems for x in u])
            sharded = column([x.saved_elems_sharded for x in u])
            replicated = column([x.saved_elems_replicated for x in u])
            attention = column([x.attention_saved_elems for x in u])
            present = counts > 0
            op_level = column([op_level_saved_elems(x) for x in u]).reshape(len(u), 2)
            self._loads[key] = RankLoads(
                counts=counts,
                params=counts @ params,
                kept_inputs=counts @ kept,
                saved_sharded=counts @ sharded,
                saved_replicated=counts @ replicated,
                saved_attention=counts @ attention,
                op_saved_sharded=counts @ op_level[:, 0],
                op_saved_replicated=counts @ op_level[:, 1],
                layer_params=present * params,
                layer_saved_sharded=present * sharded,
                layer_saved_replicated=present * replicated,
                layer_saved_attention=present * attention,
            )
        self._loads_of[id(stages)] = (stages, pp, self._loads[key])
        return self._loads[key]

    def rank_times(self, compute: np.ndarray, comm: np.ndarray, loads: RankLoads) -> _RankTimes:
        """Per-micro-batch compute and communication of each pipeline rank, for layer
        times and loads this model made (found by identity)."""
        key = (id(compute), id(loads))
        if key not in self._ranks:
            rank_compute_all = loads.counts @ compute
            rank_comm_all = loads.counts @ comm
            slowest = int(np.argmax(rank_compute_all + rank_comm_all))
            self._ranks[key] = _RankTimes(
                compute=float(rank_compute_all[slowest]),
                comm=float(rank_comm_all[slowest]),
                first_compute=float(rank_compute_all[0]),
                stage_params=float(loads.params.max()),
                blocks=float((loads.counts @ self.is_block).max()),
                param_tensors=float((loads.counts @ self.param_tensors).max()),
                partial_grads=float((loads.counts @ self.partial_grads).max()),
            )
        return self._ranks[key]

    def memory_terms(self, loads: RankLoads, plan: Plan) -> MemoryTerms:
        # plain values in the key: hashing an enum member runs Python code
        key = (id(loads), plan.mesh.tp, plan.sequence_parallel, stores_scores(plan, self.cluster))
        terms = self._memory.get(key)
        if terms is None:
            terms = self._memory[key] = memory_terms(loads, plan, self.cluster)
        return terms

    def ring(self, nbytes: float, mesh: Mesh, axis: Axes, collective: Collective) -> float:
        """:func:`ring_time` on this model's cluster, each collective costed once."""
        key = (nbytes, mesh, axis, collective)
        if key not in self._rings:
            self._rings[key] = ring_time(nbytes, mesh, axis, self.cluster, collective=collective)
        return self._rings[key]

    def estimate(self, plan: Plan, stages: list[list[int]]) -> Estimate:
        """Predict ``plan`` with layers split into ``stages`` (pp x virtual_stages chunks
        of layer indices, in order; chunk ``c`` runs on pipeline rank ``c % pp``)."""
        memory = self.memory(plan, stages)
        return Estimate(
            time=self.time(plan, stages),
            memory=memory,
            fits=memory.total_gib <= self.cluster.device.memory_gib,
            model_flops=3 * self.forward_flops * plan.global_batch_size,
        )

    def memory(self, plan: Plan, stages: list[list[int]]) -> MemoryBreakdown:
        """:meth:`estimate`'s memory alone (a search needs no time for a plan that
        does not fit)."""
        loads = self.rank_loads(stages, plan.mesh.pp)
        terms = self.memory_terms(loads, plan)
        return rank_memory(loads, plan, self.cluster, in_flight_microbatches(plan), terms)

    def time(self, plan: Plan, stages: list[list[int]]) -> TimeBreakdown:
        """:meth:`estimate`'s time alone."""
        return _time(self, plan, stages)


@dataclass(frozen=True)
class _RankTimes:
    """One plan's stages under its layer times: the slowest rank's compute and
    communication per micro-batch, the first rank's compute, and the largest stage's
    parameters, blocks, parameter tensors and tensors whose gradients sequence
    parallelism leaves partial (:func:`sequence_parallel_partial_grads`)."""

    compute: float
    comm: float
    first_compute: float
    stage_params: float
    blocks: float
    param_tensors: float
    partial_grads: float = 0.0


def _time(model: CostModel, plan: Plan, stages: list[list[int]]) -> TimeBreakdown:
    profile, cluster = model.profile, model.cluster
    mesh, device = plan.mesh, cluster.device
    bpe = device.bytes_per_element
    compute, comm = model.layer_times(plan)
    loads = model.rank_loads(stages, mesh.pp)
    ranks = model.rank_times(compute, comm, loads)
    rank_compute, rank_tp = ranks.compute, ranks.comm
    per_micro = rank_compute + rank_tp
    m = plan.num_microbatches
    p2p = 0.0
    if mesh.pp > 1:
        boundary = profile.layers[stages[0][-1]].output_elems * plan.microbatch_size * bpe
        boundary /= mesh.tp * mesh.cp
        per_node, _ = group_span(mesh, MeshAxis.PP, cluster.devices_per_node)
        link = cluster.intra_node if per_node > 1 else cluster.inter_node
        bandwidth = link.bandwidth if per_node > 1 else link.bandwidth / cluster.devices_per_node
        # Forward activation and backward gradient for each of the v chunks.
        p2p = m * 2 * plan.virtual_stages * (boundary / bandwidth + link.latency_s)
    if plan.schedule is PipelineSchedule.GPIPE:
        bubble = (mesh.pp - 1) * per_micro
    else:
        bubble = (mesh.pp - 1) / plan.virtual_stages * per_micro

    stage_params = ranks.stage_params / mesh.tp
    grad_bytes = stage_params * bpe
    # DDP all-reduces gradients in buckets of 25 MB (over dp and cp, which hold the same
    # weights); a distributed optimizer reduce-scatters them and all-gathers the updated
    # weights, in Megatron-Core's buckets; FSDP gathers and reduces per layer.
    replicas: Axes = (MeshAxis.CP, MeshAxis.DP) if mesh.cp > 1 else MeshAxis.DP
    bucket_bytes = DDP_BUCKET_BYTES
    runtime_zero1 = plan.distributed_optimizer and mesh.world_size == mesh.dp
    if plan.distributed_optimizer and not runtime_zero1:
        # Megatron-Core's buckets grow with the replicas so that the collectives do not
        # become latency-bound: max(40M, 1M x dp) parameters (DistributedDataParallel-
        # Config.bucket_size).
        bucket_bytes = max(40e6, 1e6 * mesh.dp * mesh.cp) * bpe
    buckets = max(1.0, grad_bytes / bucket_bytes)
    all_reduce, reduce_scatter, all_gather = (
        Collective.ALL_REDUCE,
        Collective.REDUCE_SCATTER,
        Collective.ALL_GATHER,
    )
    if runtime_zero1:
        # The runtime's distributed optimizer (over dp alone): DDP's all-reduce, then
        # each parameter broadcast from the rank that updated it.
        sync = buckets * model.ring(grad_bytes / buckets, mesh, replicas, all_reduce)
        sync += owner_broadcasts_time(grad_bytes, ranks.param_tensors, mesh, replicas, cluster)
    elif plan.distributed_optimizer:
        bucket = model.ring(grad_bytes / buckets, mesh, replicas, reduce_scatter)
        sync = buckets * (bucket + model.ring(grad_bytes / buckets, mesh, replicas, all_gather))
    else:
        sync = buckets * model.ring(grad_bytes / buckets, mesh, replicas, all_reduce)
    if mesh.fsdp > 1:
        # Per unit: one reduce-scatter of its gradients per step (the runtime syncs on
        # the last micro-batch only), and an all-gather of its weights in forward and
        # backward of every micro-batch (ZeRO-3), or once per step where the gathered
        # weights are kept until the step's last backward (ZeRO-2).
        units = fsdp_units(plan, ranks.blocks)
        unit_bytes = grad_bytes / units
        one = model.ring(unit_bytes, mesh, MeshAxis.FSDP, reduce_scatter)
        one += fsdp_gathers(plan) * model.ring(unit_bytes, mesh, MeshAxis.FSDP, all_gather)
        sync += units * one
    passes = 3 + plan.recomputed_fraction
    overlap = device.overlaps_communication
    last_backward = ranks.first_compute * 2 / passes if overlap else 0.0
    exposed_sync = max(0.0, sync - last_backward) + fsdp_framework_time(
        plan, model.cluster.device, ranks.blocks, ranks.param_tensors
    )
    if plan.sequence_parallel and mesh.tp > 1 and not overlap:
        # AdamW reads each partial gradient twice (its two moments), and DTensor
        # all-reduces it each time: 48 small all-reduces in the optimizer's step of the
        # plan_ranking GPT's 4 blocks (torch.profiler, 2026-11-26). A GPU hides them.
        tensor_bytes = (profile.hidden or 1024) * bpe
        one = model.ring(tensor_bytes, mesh, MeshAxis.TP, all_reduce)
        exposed_sync += 2 * ranks.partial_grads * one
    optimizer_bandwidth = device.optimizer_bandwidth or device.memory_bandwidth
    shards = mesh.fsdp * (mesh.dp * mesh.cp if plan.distributed_optimizer else 1)
    optimizer = stage_params / shards * ADAM_STEP_BYTES_PER_PARAM / optimizer_bandwidth
    host = ranks.param_tensors * OPTIMIZER_HOST_OPS_PER_TENSOR * device.host_op_s
    optimizer = max(optimizer, host)  # an eager GPU's optimizer waits for its host too
    return TimeBreakdown(
        compute_s=m * rank_compute,
        tp_comm_s=m * rank_tp,
        pipeline_bubble_s=bubble,
        p2p_s=p2p,
        grad_sync_s=exposed_sync,
        optimizer_s=optimizer,
    )
