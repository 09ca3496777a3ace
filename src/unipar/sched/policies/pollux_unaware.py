"""Pollux on a cluster of several GPU types, as Sia's authors evaluated it (SOSP'23 §6.1).

Pollux knows one GPU type. Sia's artifact (``cluster_unaware.py``, ``pollux_unaware.py``)
runs it on *virtual nodes* of the smallest node size (an 8-GPU node is two 4-GPU virtual
nodes), with each job's throughput model fitted on all its step times whatever GPU type
measured them (the first report of a configuration kept), at most 2x the GPUs it has run
on and at most the GPUs of the smallest type; each job's allocation is then cut to the
GPU type most of its GPUs have (ties to the faster type), the rest left idle. Our rendering
runs our Pollux (:func:`unipar.sched.policies.goodput.pollux_policy`: p = −1 over speedups
against a fair share, its reallocation factor with δ = 30 s; a greedy search in place of
its genetic algorithm) on those virtual nodes.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from unipar.errors import ConfigError
from unipar.sched.cluster import Cluster
from unipar.sched.placement import Nodes
from unipar.sched.policies.goodput import GoodputPolicy, pollux_policy
from unipar.sched.policy import Allocation, JobView, RoundState
from unipar.sched.typed_cluster import TypedAllocation, TypedCluster
from unipar.sched.typed_policy import BatchModel, TypedJobView, TypedPolicy, TypedRoundState

# ties between GPU types go to the faster (Sia's ``fix_allocations_by_dropping``)
TYPE_PRIORITY = ("dgx-ext", "azure", "quad", "rtx", "aws")
POLLUX_RESTART_SECONDS = 30.0  # the δ of Pollux's reallocation factor


def virtual_nodes(cluster: TypedCluster) -> list[tuple[int, int]]:
    """(real node, GPUs) per virtual node, all of the smallest node size."""
    size = min(t.gpus_per_node for t in cluster.types)
    out = []
    for t in cluster.types:
        if t.gpus_per_node % size:
            raise ConfigError(
                f"a heterogeneity-unaware policy splits nodes into {size}-GPU virtual nodes, "
                f"but type {t.name!r} has {t.gpus_per_node} GPUs per node"
            )
        for node in cluster.nodes_of(t.name):
            out += [(node, size)] * (t.gpus_per_node // size)
    return out


@dataclass
class UnawarePolluxPolicy(TypedPolicy):
    name: str = "pollux"
    inner: GoodputPolicy = field(default_factory=pollux_policy)
    batch_model = BatchModel.MERGED
    _virtual: dict[str, Nodes] = field(default_factory=dict)

    def _view(self, job: TypedJobView, cluster: TypedCluster, limit: int) -> JobView:
        first = job.limits[cluster.type_names[0]]
        held = self._virtual.get(job.name) if job.allocation is not None else None
        return JobView(
            name=job.name, submit_time=job.submit_time,
            requested_replicas=job.requested_replicas, requested_batch=job.requested_batch,
            init_batch=job.init_batch, max_batch=job.max_batch, min_local=first.min_local,
            max_local=first.max_local, progress=job.progress,
            attained_service=job.attained_service, run_time=0.0, restarts=job.restarts,
            max_replicas_seen=job.merged_seen,
            allocation=Allocation(held, 1) if held else None,
            model=job.merged_model, grad_sqr=(job.grad or (1.0, 1.0))[0],
            grad_var=(job.grad or (1.0, 1.0))[1],
            max_replicas=min(limit, job.max_batch // first.min_local),
        )

    def allocate(self, state: TypedRoundState) -> dict[str, TypedAllocation]:
        cluster = state.cluster
        vnodes = virtual_nodes(cluster)
        size = vnodes[0][1]
        # the most GPUs one job may hold: the GPUs of the smallest type (nodes a job may span)
        limit = min(
            t.gpus_per_node * cluster.job_nodes(t.name)
            for t in cluster.types
        )
        views = [self._view(j, cluster, limit) for j in state.jobs]
        virtual = self.inner.allocate(RoundState(
            now=state.now, cluster=Cluster.uniform(len(vnodes), size), jobs=views,
            available_nodes=tuple(range(len(vnodes))), restart_seconds=POLLUX_RESTART_SECONDS,
            interval=state.interval,
        ))
        out: dict[str, TypedAllocation] = {}
        self._virtual = {}
        for name, alloc in virtual.items():
            kept = _one_type(alloc.nodes, vnodes, cluster)
            self._virtual[name] = kept
            real: dict[int, int] = {}
            for v, g in kept:
                real[vnodes[v][0]] = real.get(vnodes[v][0], 0) + g
            gpu_type = cluster.type_of(vnodes[kept[0][0]][0]).name
            out[name] = TypedAllocation(gpu_type, tuple(sorted(real.items())))
        return out


def _one_type(nodes: Nodes, vnodes: list[tuple[int, int]], cluster: TypedCluster) -> Nodes:
    """The virtual nodes of the GPU type holding most of the job's GPUs (ties: faster)."""
    count: dict[str, int] = {}
    for v, g in nodes:
        t = cluster.type_of(vnodes[v][0]).name
        count[t] = count.get(t, 0) + g
    rank = {t: i for i, t in enumerate(TYPE_PRIORITY)}
    best = max(count, key=lambda t: (count[t], -rank.get(t, len(rank))))
    return tuple((v, g) for v, g in nodes if cluster.type_of(vnodes[v][0]).name == best)
