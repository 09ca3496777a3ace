"""unipar's policy for a cluster of several GPU types: type, GPU count and batch by goodput.

For every job j and every configuration c = (GPU type, GPUs) on one node or on whole nodes,
the goodput G_jc is the best over batch sizes (:mod:`unipar.goodput.batch`) of the
throughput model of j's application on that type, pooled over every job of the
application that ran there (a shared cluster runs the same model many times; a job's
own model until any has, or the model of another type times the two types' one-GPU
throughput ratio, the profile Sia takes of a new job). Each round minimises

    Σ_j w_j · (G_jc / B_j)^p,    p = −0.5,  w_j = (remaining seconds of j at B_j / 1 h)^−½

over one configuration per job with at most the GPUs each type has, where B_j is j's best
one-GPU goodput on any type: the generalised mean of Pollux (eq. 12) and Sia (§4.2) over
speedups, weighted towards the jobs closest to their end (Pollux's and Sia's admit no
length information; unipar's homogeneous policy showed it shortens the average JCT). The
weights' exponent is ½, not the homogeneous policy's 1: on Sia's traces, where a 100-hour
imagenet job shares the cluster with 6-minute cifar10 jobs, an exponent of 1 weighs the
long job 1,000 times less than the short one (32 times at ½), and the long job was moved
for small gains of short ones (imagenet on newTrace workload 1: 102 restarts of 250 s,
JCT 22.9 h; 70 and 18.5 h at ½; average JCT 0.724 h against 0.671 h; measured with
exponents ½ to 1 on newTrace workload 1, ¼ to 1 on workload 2 and Philly 1-8,
``docs/heterogeneous-clusters.md``). A running job's goodput at any other configuration is
scaled by Pollux's reallocation factor (T − R·δ)/(T + δ) times T_c/(T_c + δ), T_c its
predicted remaining seconds there, δ its application's restart seconds: a move pays only
when the time it saves exceeds the restart.
A job still restarting keeps its GPUs.

Search (:mod:`unipar.sched.assign`): the integer program is a multiple-choice knapsack with
one capacity per GPU type, every admitted job getting a configuration; it admits as many
jobs as there are GPUs, the first submitted (jobs still restarting first). After a
reduction that keeps the optimum (per job and type only configurations cheaper than every
smaller one of the same type: a dominated one can be swapped for the smaller at no loss),
it is solved exactly by dynamic programming over the GPUs used per type where
those states are few (Sia's 64 GPUs: 25·17·25), else by its LP relaxation (HiGHS), which
has at most one fractional job per type, rounded. Deterministic, and tens of milliseconds
for 960 jobs on 64 GPUs.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from unipar.goodput.batch import best_batch
from unipar.sched.assign import assign
from unipar.sched.policies.sia import Config, held_config, place_typed
from unipar.sched.typed_cluster import TypedAllocation, TypedCluster
from unipar.sched.typed_policy import BatchModel, TypedJobView, TypedPolicy, TypedRoundState

MAX_JOB_GPUS = 64  # the most GPUs the traces measured one job on


def configurations(cluster: TypedCluster, max_gpus: int = MAX_JOB_GPUS) -> list[Config]:
    """Every count within one node, then whole nodes (a job spans whole nodes or fits in
    one, as unipar's homogeneous policy places it)."""
    out = []
    for t in cluster.types:
        gpn = t.gpus_per_node
        nodes = cluster.job_nodes(t.name)
        out += [Config(t.name, 1, k) for k in range(1, gpn + 1)]
        out += [Config(t.name, n, n * gpn) for n in range(2, nodes + 1) if n * gpn <= max_gpus]
    return out


@dataclass
class TypedGoodputPolicy(TypedPolicy):
    name: str = "unipar"
    p: float = -0.5
    remaining_power: float = 0.5  # w_j = (remaining hours at B_j)^-remaining_power
    explore: float = 2.0  # most GPUs on a type = explore x most run there (pooled)
    restart_horizon: float = float("inf")  # seconds a new configuration is expected to last
    batch_model = BatchModel.POOLED

    def goodput(self, state: TypedRoundState, jobs: list[TypedJobView],
                configs: list[Config]) -> np.ndarray:
        """(J, C) predicted goodput in steps at M0 per second (0: not allowed), one
        vectorised batch search over every job and configuration."""
        cluster = state.cluster
        shape = (len(jobs), len(configs))
        kinds = [c.gpu_type for c in configs]
        cols = {t: np.array([k == t for k in kinds]) for t in cluster.type_names}
        k = np.array([c.gpus for c in configs], float)
        nodes = np.broadcast_to(np.array([c.nodes for c in configs], float), shape).copy()
        params = np.zeros((*shape, 7))
        params[..., 6] = 1.0  # γ of a configuration left out (not 0: no 1/γ warning)
        low, high, ratio = np.ones(shape), np.ones(shape), np.zeros(shape)
        allowed = np.zeros(shape, bool)
        unknown = np.zeros(shape)  # one GPU's samples/s over M0, for an unknown application
        grad = np.array([j.grad or (1.0, 0.0) for j in jobs])  # none yet: gain 1
        for i, job in enumerate(jobs):
            models = {**job.models, **job.pooled_models}
            for t in cluster.type_names:
                c = cols[t]
                source = t if t in models else max(models, key=job.profile.get, default=None)
                if source is None:
                    unknown[i, c & (k == 1)] = job.profile[t] / job.init_batch
                    continue
                seen = max(n.get(s, 0) for n in (job.seen, job.pooled_seen) for s in (source, t))
                allowed[i, c] = k[c] <= max(1, int(self.explore * seen))
                params[i, c] = models[source].as_array()
                low[i, c], high[i, c] = job.limits[source].min_local, job.limits[source].max_local
                ratio[i, c] = job.profile[t] / job.profile[source]
                if source != t:
                    nodes[i, c] = np.ceil(k[c] / cluster.gpu_type(source).gpus_per_node)
        init = np.array([[j.init_batch] for j in jobs], float)
        top = np.array([[j.max_batch] for j in jobs], float)
        choice = best_batch(params, grad[:, :1], grad[:, 1:], init, top, low, high, nodes, k)
        return np.where(allowed, choice.goodput * ratio, unknown)

    def _admit(self, state: TypedRoundState, configs: list[Config]) -> list[TypedJobView]:
        """Jobs still restarting (they keep their GPUs), then the first submitted, one GPU
        each, as many as the rest of the GPUs."""
        pinned = [j for j in state.jobs
                  if j.restart_left > 0 and held_config(j, configs) is not None]
        names = {j.name for j in pinned}
        others = sorted((j for j in state.jobs if j.name not in names),
                        key=lambda j: j.submit_time)
        free = state.cluster.total_gpus - sum(j.allocation.replicas for j in pinned)
        return pinned + others[: max(free, 0)]

    def allocate(self, state: TypedRoundState) -> dict[str, TypedAllocation]:
        configs = configurations(state.cluster)
        jobs = self._admit(state, configs)
        if not jobs:
            return {}
        good = self.goodput(state, jobs, configs)
        gpus = np.array([c.gpus for c in configs])
        base = np.maximum(np.where(gpus[None, :] == 1, good, 0).max(axis=1), 1e-12)
        remaining = np.array([j.remaining_progress for j in jobs]) / base
        speedup = good / base[:, None]
        held = [held_config(j, configs) for j in jobs]
        self._restart(state, jobs, speedup, good, held)
        with np.errstate(divide="ignore"):
            cost = np.where(speedup > 0, speedup**self.p, np.inf)
        floor = max(state.interval, 1e-3)
        weight = (np.maximum(remaining, floor) / 3600.0) ** -self.remaining_power
        cost = cost * weight[:, None]
        pinned = {i: c for i, (j, c) in enumerate(zip(jobs, held, strict=True))
                  if j.restart_left > 0 and c is not None}
        chosen = solve_assignment(cost, configs, state.cluster, pinned)
        if chosen is None:  # no assignment found in time: every job keeps what it holds
            return {j.name: j.allocation for j in jobs if j.allocation is not None}
        demands: dict[str, list] = {}
        for i, c in chosen.items():
            demands.setdefault(configs[c].gpu_type, []).append((jobs[i].name, configs[c].gpus))
        return place_typed(demands, state)

    def _restart(self, state, jobs, speedup, good, held) -> None:
        """Pollux's reallocation factor times H_c / (H_c + δ) on every configuration but a
        running job's own, H_c = min(T_c, horizon), T_c its predicted remaining seconds at
        c: the restart is paid back only over the time the new configuration lasts."""
        for i, job in enumerate(jobs):
            if held[i] is None:
                continue
            delta = job.restart_seconds
            age = state.now - job.submit_time
            factor = max(0.0, (age - job.restarts * delta) / (age + delta))
            with np.errstate(divide="ignore", invalid="ignore"):
                left = np.minimum(job.remaining_progress / good[i], self.restart_horizon)
                factor = factor * np.where(np.isfinite(left), left / (left + delta), 0.0)
            keep = speedup[i, held[i]]
            speedup[i] *= factor
            speedup[i, held[i]] = keep


def solve_assignment(cost: np.ndarray, configs: list[Config], cluster: TypedCluster,
                     pinned: dict[int, int]) -> dict[int, int] | None:
    """One configuration per job minimising Σ cost with at most each type's GPUs, pinned
    jobs keeping theirs (:func:`unipar.sched.assign.assign`); None if none fits."""
    types = cluster.type_names
    kinds = np.array([types.index(c.gpu_type) for c in configs])
    gpus = np.array([c.gpus for c in configs])
    capacity = np.array([cluster.gpus(t) for t in types])
    choice = assign(cost, kinds, gpus, capacity, pinned)
    return None if choice is None else dict(enumerate(choice.tolist()))


def make_unipar() -> TypedGoodputPolicy:
    return TypedGoodputPolicy()
