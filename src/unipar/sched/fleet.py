"""Which nodes exist each round, and what they cost (node-hours x price)."""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from unipar.errors import ConfigError
from unipar.sched.cluster import SPOT, Cluster, NodeType
from unipar.sched.goodput import goodput_table, job_arrays
from unipar.sched.policy import JobView


class Fleet:
    """The nodes a round may use. ``available_nodes`` is called at the start of each round,
    ``account`` at its end (to charge the round's nodes)."""

    def __init__(self, cluster: Cluster) -> None:
        self.cluster = cluster
        self.cost = 0.0  # price units (per node-hour) x hours
        self.node_seconds = 0.0
        self._nodes: tuple[int, ...] = tuple(range(cluster.num_nodes))

    @property
    def max_gpus(self) -> int:
        """The most GPUs one job could ever get."""
        return self.cluster.total_gpus

    def available_nodes(self, now: float, jobs: Sequence) -> tuple[int, ...]:
        return self._nodes

    def account(self, now: float, interval: float) -> None:
        for n in self._nodes:
            self.cost += self.cluster.nodes[n].price_per_hour * interval / 3600.0
        self.node_seconds += len(self._nodes) * interval


class FixedFleet(Fleet):
    """Every node of the cluster, all the time."""


class AutoscaleFleet(Fleet):
    """Grows and shrinks between ``min_nodes`` and the cluster's nodes by utility, after
    Pollux's cloud mode (§4.3): every ``every`` seconds each job's useful GPUs are the most
    at which its goodput per GPU is still ``efficiency`` of its goodput on one GPU (from
    what it reported, the model pooled over its application, at most twice what it or its
    peers ran on); the fleet holds the nodes their sum needs. Nodes leave from the end."""

    def __init__(
        self, cluster: Cluster, min_nodes: int, efficiency: float = 0.5, every: float = 300.0
    ) -> None:
        super().__init__(cluster)
        if not 1 <= min_nodes <= cluster.num_nodes:
            raise ConfigError(
                f"autoscaling needs 1 <= MIN <= MAX nodes, but got {min_nodes}:"
                f"{cluster.num_nodes}"
            )
        self.min_nodes, self.efficiency, self.every = min_nodes, efficiency, every
        self._nodes = tuple(range(min_nodes))
        self._next = -math.inf

    def available_nodes(self, now: float, jobs: Sequence[JobView]) -> tuple[int, ...]:
        if now < self._next or not jobs:
            return self._nodes
        self._next = now + self.every
        gpn = self.cluster.gpus_per_node
        demand = int(useful_gpus(jobs, self.cluster.total_gpus, gpn, self.efficiency).sum())
        want = min(max(math.ceil(demand / gpn), self.min_nodes), self.cluster.num_nodes)
        self._nodes = tuple(range(want))
        return self._nodes


def useful_gpus(
    jobs: Sequence[JobView], max_gpus: int, gpus_per_node: int, efficiency: float = 0.5
) -> np.ndarray:
    """Each job's useful GPUs (Pollux §4.3): the most at which its goodput per GPU is still
    ``efficiency`` of its goodput on one GPU, at most twice what it or its peers ran on."""
    cap = np.array([max(1, 2 * max(j.max_replicas_seen, j.peer_max_replicas))
                    for j in jobs])
    kmax = int(min(cap.max(), max_gpus))
    table = goodput_table(job_arrays(jobs, [j.peer_model or j.model for j in jobs]),
                          kmax, gpus_per_node)
    k = np.arange(1, kmax + 1)
    per_gpu = table.goodput / (k[None, :] * np.maximum(table.goodput[:, :1], 1e-300))
    useful = (per_gpu >= efficiency) & (k[None, :] <= cap[:, None])
    return np.where(useful, k[None, :], 1).max(axis=1)


class SpotFleet(Fleet):
    """Every node is a spot node; each is preempted ``rate`` times per hour on average
    (a seeded Poisson process) and comes back after ``downtime`` seconds. A preempted job
    loses its GPUs, keeps its progress (checkpointed) and is rescheduled."""

    def __init__(self, cluster: Cluster, rate: float, seed: int, downtime: float = 600.0):
        super().__init__(cluster)
        self.rate, self.downtime = rate, downtime
        self._rng = np.random.default_rng(seed)
        self._back = dict.fromkeys(range(cluster.num_nodes), 0.0)
        self.preempted = 0

    def available_nodes(self, now: float, jobs: Sequence) -> tuple[int, ...]:
        self._nodes = tuple(n for n, t in self._back.items() if t <= now)
        return self._nodes

    def account(self, now: float, interval: float) -> None:
        super().account(now, interval)
        hits = self._rng.random(len(self._nodes)) < 1 - math.exp(-self.rate * interval / 3600)
        for n, hit in zip(self._nodes, hits, strict=True):
            if hit:
                self._back[n] = now + interval + self.downtime
                self.preempted += 1


def make_fleet(cluster: Cluster, autoscale: str | None, spot_rate: float, seed: int) -> Fleet:
    """The fleet the CLI flags ask for: ``--autoscale MIN:MAX``, ``--spot RATE``."""
    if autoscale:
        lo, _, hi = autoscale.partition(":")
        if not (lo.isdigit() and hi.isdigit()):
            raise ConfigError(f"--autoscale wants MIN:MAX node counts, but got {autoscale!r}")
        nodes = (cluster.nodes[0],) * int(hi)
        cluster = Cluster(nodes)
        return AutoscaleFleet(cluster, int(lo))
    if spot_rate > 0:
        kind = NodeType(SPOT.name, cluster.gpus_per_node, SPOT.price_per_hour, True)
        return SpotFleet(Cluster((kind,) * cluster.num_nodes), spot_rate, seed)
    return FixedFleet(cluster)
