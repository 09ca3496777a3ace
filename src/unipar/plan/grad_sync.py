"""How a data-parallel plan exchanges gradients: all-reduce, or parameter servers for a
model whose embedding tables dominate (each step touches a few rows). Pure: the model
is looked at on the meta device and priced with :mod:`unipar.plan.sync_cost`.

- The tables and how many ids each sample looks up: a meta forward with hooks on every
  ``nn.Embedding``. A table whose weight another module shares (a tied output layer)
  gets a dense gradient and counts as dense.
- Rows a worker touches per step, for ``n`` ids drawn uniformly from ``R`` rows: the
  expected number of distinct rows ``R (1 - (1 - 1/R)^n)`` (occupancy; Feller 1968,
  Ch. II.11). Skewed ids (Zipf, as in click logs) touch fewer, which favours the
  servers further: the estimate is conservative for them.
- One server per node, holding tables, dense tensors and optimizer state (Li et al.,
  OSDI 2014); a worker's link is its node's network shared by the node's devices.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import torch
from torch import nn

from unipar.analysis.profile import ModelProfile
from unipar.cluster.spec import ClusterSpec
from unipar.models.spec import ModelSpec
from unipar.plan.representation import GradSync
from unipar.plan.strategy_search import Candidate, Constraints, search
from unipar.plan.sync_cost import (
    WORTH_SERVING_SHARE,
    Links,
    SparseWorkload,
    SyncChoice,
    choose_grad_sync,
)

# Seconds per touched row of the parameter-server path end to end (unique ids, route,
# gather, scatter, the server's update), as `benchmarks/ps_vs_allreduce.py` calibrates
# it on a 2-core CPU machine: 150-160 ns.
DEFAULT_ROW_S = 155e-9
# One actor call's round trip (Ray, same node), as the same benchmark measures it.
DEFAULT_PS_LATENCY_S = 550e-6


@dataclass(frozen=True)
class TableUse:
    """An embedding table and the ids one sample looks up in it."""

    name: str
    rows: int
    dim: int
    ids_per_sample: float


@dataclass(frozen=True)
class SparseFacts:
    """What decides the exchange: the sparse tables and the dense rest."""

    tables: tuple[TableUse, ...]
    dense_params: int

    @property
    def table_params(self) -> int:
        return sum(t.rows * t.dim for t in self.tables)

    @property
    def table_share(self) -> float:
        return self.table_params / max(self.table_params + self.dense_params, 1)


@dataclass(frozen=True)
class GradSyncDecision:
    """The exchange chosen: ``candidate`` is the pure data-parallel plan the servers
    were priced for (with ``choice``: both prices and the reason); ``why_not`` says why
    the servers were not considered or lost."""

    kind: GradSync
    choice: SyncChoice | None = None
    candidate: Candidate | None = None
    why_not: str = ""
    touched_fraction: float = 0.0
    servers: int = 0


def sparse_facts(model: ModelSpec) -> SparseFacts:
    """The model's embedding tables (with ids per sample) and its dense parameters,
    built on the meta device; ids are counted by one forward of one sample, run only
    when the tables hold enough of the parameters to be worth serving."""
    module = model.meta_model
    embeddings, dense = _untied_embeddings(module)
    ids = dict.fromkeys(embeddings, 0.0)
    facts = SparseFacts(_tables(embeddings, ids), dense)
    if facts.table_share < WORTH_SERVING_SHARE:
        return facts

    def count(mod: nn.Module, args: tuple, name: str) -> None:
        ids[name] += args[0].numel()

    handles = [
        m.register_forward_pre_hook(lambda mod, args, name=name: count(mod, args, name))
        for name, m in embeddings.items()
    ]
    try:
        with torch.device("meta"), torch.no_grad():
            model.call(module, model.sample_inputs())
    finally:
        for h in handles:
            h.remove()
    return SparseFacts(_tables(embeddings, ids), dense)


def parameter_facts(module: nn.Module) -> SparseFacts:
    """The tables and dense parameters of ``module`` (built on the meta device), no
    forward (ids per sample unknown: 0); enough for the share the tables hold."""
    embeddings, dense = _untied_embeddings(module)
    return SparseFacts(_tables(embeddings, dict.fromkeys(embeddings, 0.0)), dense)


def _untied_embeddings(module: nn.Module) -> tuple[dict[str, nn.Embedding], int]:
    """Embeddings whose weight no other module shares, and the count of every other
    parameter (a tied table's gradient is dense)."""
    owners: dict[int, int] = {}
    for m in module.modules():
        for p in m.parameters(recurse=False):
            owners[id(p)] = owners.get(id(p), 0) + 1
    embeddings = {
        name: m
        for name, m in module.named_modules()
        if isinstance(m, nn.Embedding) and owners.get(id(m.weight), 0) == 1
    }
    served = {id(m.weight) for m in embeddings.values()}
    return embeddings, sum(p.numel() for p in module.parameters() if id(p) not in served)


def _tables(embeddings: dict[str, nn.Embedding], ids: dict[str, float]) -> tuple[TableUse, ...]:
    return tuple(
        TableUse(n, m.num_embeddings, m.embedding_dim, ids[n]) for n, m in embeddings.items()
    )


def touched_fraction(facts: SparseFacts, local_batch: int) -> float:
    """Share of all table rows one worker's batch touches, uniform ids (see above)."""
    touched = sum(
        t.rows * -math.expm1(local_batch * t.ids_per_sample * math.log1p(-1 / t.rows))
        if t.rows > 1
        else 1.0
        for t in facts.tables
    )
    return min(touched / max(sum(t.rows for t in facts.tables), 1), 1.0)


def cluster_links(cluster: ClusterSpec) -> Links:
    """Links of ``cluster`` for :mod:`unipar.plan.sync_cost`: ring all-reduce at the slowest
    hop's per-device bandwidth, workers and servers over the node network (within one
    node, its links)."""
    if cluster.nodes > 1:
        per_device = cluster.inter_node.bandwidth / cluster.devices_per_node
        server, latency = cluster.inter_node.bandwidth, cluster.inter_node.latency_s
    else:
        per_device = server = cluster.intra_node.bandwidth
        latency = cluster.intra_node.latency_s
    return Links(
        all_reduce_bw=per_device,
        worker_bw=per_device,
        server_bw=server,
        latency_s=latency,
        ps_latency_s=max(DEFAULT_PS_LATENCY_S, latency),
        update_bw=cluster.device.memory_bandwidth,
        row_s=DEFAULT_ROW_S,
    )


def decide_grad_sync(
    profile: ModelProfile,
    facts: SparseFacts,
    cluster: ClusterSpec,
    global_batch_size: int,
    constraints: Constraints,
    best: Candidate,
) -> GradSyncDecision:
    """All-reduce or parameter servers. Servers are priced only for a model whose
    tables hold at least half the parameters (below that, pulls and pushes move about
    as much as an all-reduce), on the fastest pure data-parallel plan the constraints
    allow; they win when that plan with servers beats ``best`` (the searched plan,
    all-reduce) per step."""
    if not facts.tables:
        return GradSyncDecision(GradSync.ALL_REDUCE, why_not="the model has no embedding table")
    if facts.table_share < WORTH_SERVING_SHARE:
        return GradSyncDecision(
            GradSync.ALL_REDUCE,
            why_not=f"embedding tables hold {facts.table_share:.0%} of the parameters "
            f"(< {WORTH_SERVING_SHARE:.0%})",
        )
    pinned = {"tp": constraints.tp, "pp": constraints.pp, "fsdp": constraints.fsdp}
    if any(v not in (None, 1) for v in pinned.values()) or cluster.num_devices < 2:
        return GradSyncDecision(
            GradSync.ALL_REDUCE,
            why_not="servers serve pure data parallelism over 2 or more workers, which "
            "the constraints or the cluster rule out",
        )
    only_dp = replace(constraints, tp=1, pp=1, fsdp=1, cp=1, dp=cluster.num_devices)
    candidate = search(profile, cluster, global_batch_size, only_dp, keep=1).best
    estimate, plan = candidate.estimate, candidate.plan
    fraction = touched_fraction(facts, plan.microbatch_size * plan.num_microbatches)
    rows = sum(t.rows for t in facts.tables)
    workload = SparseWorkload(
        table_rows=rows,
        dim=max(1, round(facts.table_params / rows)),
        dense_params=facts.dense_params,
        touched_fraction=fraction,
        workers=plan.mesh.dp,
        servers=cluster.nodes,
        serve_dense=True,
        # the workers' own step: no exchange, and no optimizer (the servers run it; an
        # all-reduce's update is priced apart, :func:`price_all_reduce`)
        compute_s=estimate.step_time_s - estimate.time.grad_sync_s - estimate.time.optimizer_s,
    )
    choice = choose_grad_sync(workload, cluster_links(cluster))
    decided = GradSyncDecision(choice.kind, choice, candidate, "", fraction, cluster.nodes)
    if choice.kind is GradSync.PARAMETER_SERVER and choice.ps.step_s >= best.estimate.step_time_s:
        return replace(
            decided,
            kind=GradSync.ALL_REDUCE,
            why_not=f"servers under dp={plan.mesh.dp} take {choice.ps.step_s * 1e3:.1f} ms a "
            f"step, the chosen plan {best.estimate.step_time_s * 1e3:.1f} ms",
        )
    return decided
