"""Our rendering of Sia's policy (Jayaram Subramanya et al., SOSP'23, §4), after its artifact.

Each round, for every job j and every configuration c = (GPU type, nodes, GPUs) of a fixed
set (1, 2, 4, ... GPUs within a node, then whole nodes up to 64 GPUs or the nodes the
traces measured), Sia estimates goodput G_jc (AdaptDL's best batch, :mod:`unipar.goodput
.batch`, with the total batch at most the job's requested one) from the job's model on that
type; on a type the job has not run on, from its model on the first type it ran on times
the two types' one-GPU throughput ratio (the profile Sia takes of each new job); a job that
never ran has speedup 1 on one GPU of each type. Speedups S_jc = G_jc / min_c G_jc (each
job's slowest one-GPU configuration is 1). A job's speedup at any configuration but its
current one is scaled by Pollux's reallocation factor (T − R·δ)/(T + δ) (age T, restarts R,
δ its application's restart penalty), if it holds one (a waiting job's are not scaled). It
then solves the integer program

    minimise  Σ_jc x_jc·round(S_jc^p, 2) + λ_n·(J − Σ_jc x_jc)
    s.t.      Σ_c x_jc ≤ 1 (one configuration per job),
              Σ_j Σ_{c of type t} GPUs(c)·x_jc ≤ GPUs of type t,  x binary,

with p = −0.5 and λ_n = 1.1 (the artifact's defaults), a job still restarting keeping its
configuration. We solve it with HiGHS (scipy's ``milp``) where the artifact used CBC, and
place GPUs with :func:`unipar.sched.placement.place` (keeps a job's nodes while its count
holds, packs the rest).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from unipar.errors import ConfigError
from unipar.goodput.batch import best_batch
from unipar.sched.placement import place
from unipar.sched.typed_cluster import TypedAllocation, TypedCluster
from unipar.sched.typed_policy import BatchModel, TypedJobView, TypedPolicy, TypedRoundState

ZERO_ALLOC_GAIN = 1e-4  # a configuration's speedup where no batch fits (Sia's value)
MAX_CONFIG_GPUS = 64
# Sia's restart penalties by application (``sia.py``), used in its reallocation factor
RESTART_PENALTY = {"deepspeech2": 25.0, "imagenet": 250.0, "cifar10": 30.0, "bert": 120.0,
                   "yolov3": 45.0}


@dataclass(frozen=True)
class Config:
    gpu_type: str
    nodes: int
    gpus: int


def configurations(cluster: TypedCluster, max_gpus: int = MAX_CONFIG_GPUS) -> list[Config]:
    """1, 2, 4, ... GPUs within a node, then whole nodes (Sia's ``CONFIGS_4GPU`` and
    ``CONFIGS_8GPU``), up to the type's nodes (and the most one job may span)."""
    out = []
    for t in cluster.types:
        gpn = t.gpus_per_node
        nodes = cluster.job_nodes(t.name)
        within = [2**i for i in range(gpn.bit_length()) if 2**i < gpn] + [gpn]
        out += [Config(t.name, 1, k) for k in within]
        out += [Config(t.name, n, n * gpn) for n in range(2, nodes + 1) if n * gpn <= max_gpus]
    return out


def _goodput(job: TypedJobView, gpu_type: str, cluster: TypedCluster, configs: list[Config],
             max_batch: float) -> np.ndarray | None:
    """Goodput of ``job`` at ``configs`` of ``gpu_type`` (samples at M0 per second), from
    its model there or projected from the first type it has a model on; None: unknown."""
    source = gpu_type if gpu_type in job.models else next(
        (t for t in cluster.type_names if t in job.models), None)
    if source is None or job.grad is None:
        return None
    k = np.array([c.gpus for c in configs], float)
    nodes = np.ceil(k / cluster.gpu_type(source).gpus_per_node)
    if source == gpu_type:
        nodes = np.array([c.nodes for c in configs], float)
    limits = job.limits[source]
    choice = best_batch(job.models[source].as_array(), *job.grad, job.init_batch, max_batch,
                        limits.min_local, limits.max_local, nodes, k)
    ratio = job.profile[gpu_type] / job.profile[source] if source != gpu_type else 1.0
    return choice.goodput * job.init_batch * ratio


@dataclass
class SiaPolicy(TypedPolicy):
    name: str = "sia"
    p: float = -0.5
    lambda_n: float = 1.1  # penalty of a job left without GPUs
    explore: int = 2  # most GPUs = explore x most run on (on any type)
    batch_model = BatchModel.OWN

    def __post_init__(self) -> None:
        if self.p >= 0 or self.lambda_n <= 1:
            raise ConfigError(
                f"Sia's program needs p < 0 and lambda_n > 1 (a job's least cost is 1), but "
                f"got p={self.p}, lambda_n={self.lambda_n}"
            )

    def speedups(self, state: TypedRoundState, configs: list[Config]) -> np.ndarray:
        """(J, C) speedups with the reallocation factor applied."""
        cluster = state.cluster
        types = [c.gpu_type for c in configs]
        gpus = np.array([c.gpus for c in configs])
        out = np.full((len(state.jobs), len(configs)), ZERO_ALLOC_GAIN)
        for i, job in enumerate(state.jobs):
            limit = max(min(max(self.explore * job.seen.get(t, 0), 1), MAX_CONFIG_GPUS,
                            job.max_batch // job.limits[t].min_local) for t in cluster.type_names)
            row = np.zeros(len(configs))
            unknown = []
            for t in cluster.type_names:
                cols = np.array([ct == t for ct in types]) & (gpus <= limit)
                g = _goodput(job, t, cluster, [c for c, ok in zip(configs, cols, strict=True)
                                               if ok], job.requested_batch)
                if g is None:
                    unknown.append(t)
                else:
                    row[cols] = g
            known = row[row > ZERO_ALLOC_GAIN]
            row = row / known.min() if len(known) else row
            for t in unknown:  # speedup 1 on one GPU of a type it has no estimate for
                row[(np.array(types) == t) & (gpus == 1)] = 1.0
            out[i] = np.maximum(row, ZERO_ALLOC_GAIN)
            self._realloc(state, job, out[i], configs)
        return out

    def _realloc(self, state, job: TypedJobView, row: np.ndarray, configs) -> None:
        """Scale every configuration but the one ``job`` holds by Pollux's reallocation
        factor. A job that holds none (waiting, or never started) is not scaled: Sia's
        ``__solve_mip_rescaled`` applies the factor only where the job has a previous
        configuration (``prev_allocs_v2`` is None after a round without GPUs)."""
        delta = RESTART_PENALTY.get(job.application, 30.0)
        age = state.now - job.submit_time
        held = held_config(job, configs)
        if age < delta or held is None:
            return
        factor = max(age - job.restarts * delta, 0.0) / (age + delta)
        keep = row[held]
        row *= factor
        row[held] = keep

    def allocate(self, state: TypedRoundState) -> dict[str, TypedAllocation]:
        if not state.jobs:
            return {}
        configs = configurations(state.cluster)
        speedup = self.speedups(state, configs)
        cost = np.minimum(np.round(speedup**self.p, 2), 3000.0) - self.lambda_n
        pinned = {i: held_config(j, configs) for i, j in enumerate(state.jobs)
                  if j.restart_left > 0 and held_config(j, configs) is not None}
        chosen = solve(cost, configs, state.cluster, pinned)
        demands: dict[str, list] = {}
        for i, c in chosen.items():
            demands.setdefault(configs[c].gpu_type, []).append((state.jobs[i].name,
                                                                 configs[c].gpus))
        return place_typed(demands, state)


def held_config(job: TypedJobView, configs: list[Config]) -> int | None:
    """The index of the configuration ``job`` holds (None: none, or one not in ``configs``)."""
    a = job.allocation
    if a is None:
        return None
    return next((i for i, c in enumerate(configs)
                 if c.gpu_type == a.gpu_type and c.gpus == a.replicas), None)


def solve(cost: np.ndarray, configs: list[Config], cluster: TypedCluster,
          pinned: dict[int, int]) -> dict[int, int]:
    """argmin Σ cost·x over binary x, one configuration per job, GPUs per type (HiGHS);
    only negative costs (and pinned ones) can be in an optimum."""
    from scipy.optimize import Bounds, LinearConstraint, milp  # noqa: PLC0415 (heavy: scipy)
    from scipy.sparse import csr_matrix  # noqa: PLC0415 (heavy: scipy)

    jobs, cols = np.nonzero(cost < 0)
    for i, c in pinned.items():
        if cost[i, c] >= 0:
            jobs, cols = np.append(jobs, i), np.append(cols, c)
    if len(jobs) == 0:
        return {}
    n = len(jobs)
    types = cluster.type_names
    type_row = np.array([types.index(configs[c].gpu_type) for c in cols])
    gpus = np.array([configs[c].gpus for c in cols], float)
    job_ids, job_row = np.unique(jobs, return_inverse=True)
    rows = np.concatenate([job_row, len(job_ids) + type_row])
    a = csr_matrix((np.concatenate([np.ones(n), gpus]), (rows, np.tile(np.arange(n), 2))),
                   shape=(len(job_ids) + len(types), n))
    upper = np.concatenate([np.ones(len(job_ids)), [cluster.gpus(t) for t in types]])
    lower = np.zeros(n)
    for i, c in pinned.items():
        lower[(jobs == i) & (cols == c)] = 1.0
    res = milp(cost[jobs, cols], integrality=np.ones(n), bounds=Bounds(lower, np.ones(n)),
               constraints=LinearConstraint(a, -np.inf, upper),
               options={"mip_rel_gap": 1e-4, "time_limit": 30.0})
    if res.x is None:  # out of time before any solution: the cheapest first, greedily
        return _greedy(cost, jobs, cols, gpus, type_row, upper[len(job_ids):], pinned)
    picked = np.nonzero(res.x > 0.5)[0]
    return {int(jobs[k]): int(cols[k]) for k in picked}


def _greedy(cost, jobs, cols, gpus, type_row, capacity, pinned) -> dict[int, int]:
    """Pinned jobs first, then (job, configuration) pairs by rising cost while GPUs last."""
    left = capacity.astype(float).copy()
    out: dict[int, int] = {}
    for i, c in pinned.items():
        out[i] = c
        left[type_row[(jobs == i) & (cols == c)][0]] -= gpus[(jobs == i) & (cols == c)][0]
    for k in np.argsort(cost[jobs, cols], kind="stable"):
        i, t = int(jobs[k]), type_row[k]
        if i not in out and gpus[k] <= left[t]:
            out[i] = int(cols[k])
            left[t] -= gpus[k]
    return out


def place_typed(demands: dict[str, list[tuple[str, int]]],
                state: TypedRoundState) -> dict[str, TypedAllocation]:
    """Nodes for ``(job, GPUs)`` demands per GPU type; a job keeps its nodes while its type
    and count hold."""
    out = {}
    for gpu_type, wants in demands.items():
        previous = {j.name: j.allocation.nodes for j in state.jobs
                    if j.allocation is not None and j.allocation.gpu_type == gpu_type}
        gpn = state.cluster.gpu_type(gpu_type).gpus_per_node
        wants = sorted(wants, key=lambda d: -d[1])
        nodes = place(wants, previous, list(state.cluster.nodes_of(gpu_type)), gpn, spread=True)
        out |= {name: TypedAllocation(gpu_type, n) for name, n in nodes.items()}
    return out
