"""Which nodes exist each round, and what they cost (node-hours x price)."""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from unipar.errors import ConfigError
from unipar.sched.autoscale import ScaleConfig, ScaleRule, desired_nodes
from unipar.sched.cluster import SPOT, Cluster, NodeType
from unipar.sched.policy import JobView


class Fleet:
    """The nodes a round may use. ``available_nodes`` is called at the start of each round,
    ``account`` at its end (to charge the round's nodes)."""

    def __init__(self, cluster: Cluster) -> None:
        self.cluster = cluster
        self.cost = 0.0  # price units (per node-hour) x hours
        self.node_seconds = 0.0
        self.history: list[tuple[float, int]] = []  # (round start, nodes held)
        self._nodes: tuple[int, ...] = tuple(range(cluster.num_nodes))

    @property
    def max_gpus(self) -> int:
        """The most GPUs one job could ever get."""
        return self.cluster.total_gpus

    @property
    def gpu_price(self) -> float | None:
        """JCT-seconds a GPU-second is worth, where nodes are held by need (None: held
        anyway, every GPU is free to use)."""
        return None

    def available_nodes(self, now: float, jobs: Sequence) -> tuple[int, ...]:
        return self._nodes

    def account(self, now: float, interval: float) -> None:
        for n in self._nodes:
            self.cost += self.cluster.nodes[n].price_per_hour * interval / 3600.0
        self.node_seconds += len(self._nodes) * interval
        self.history.append((now, len(self._nodes)))


class FixedFleet(Fleet):
    """Every node of the cluster, all the time."""


class AutoscaleFleet(Fleet):
    """Grows and shrinks between ``min_nodes`` and the cluster's nodes (Pollux's cloud mode,
    §4.3): every ``config.every`` seconds it moves to the size ``autoscale.desired_nodes``
    gives for the jobs in the system; nodes are billed per node-hour while held (no
    provisioning delay is modelled). It releases the nodes its jobs use least (their jobs
    are rescheduled on the rest) and adds the lowest-numbered free ones."""

    def __init__(
        self, cluster: Cluster, min_nodes: int, config: ScaleConfig | None = None
    ) -> None:
        super().__init__(cluster)
        if not 1 <= min_nodes <= cluster.num_nodes:
            raise ConfigError(
                f"autoscaling needs 1 <= MIN <= MAX nodes, but got {min_nodes}:"
                f"{cluster.num_nodes}"
            )
        self.min_nodes, self.config = min_nodes, config or ScaleConfig()
        self._nodes = tuple(range(min_nodes))
        self._next = -math.inf

    @property
    def gpu_price(self) -> float | None:
        """The price rule's λ: the policy then gives each job only the GPUs the fleet was
        sized for (:mod:`unipar.sched.price`)."""
        return self.config.price if self.config.rule is ScaleRule.PRICE else None

    def available_nodes(self, now: float, jobs: Sequence[JobView]) -> tuple[int, ...]:
        if now < self._next or not jobs:
            return self._nodes
        self._next = now + self.config.every
        want = desired_nodes(jobs, len(self._nodes), self.min_nodes, self.cluster.num_nodes,
                             self.cluster.gpus_per_node, self.config)
        held = list(self._nodes)
        if want < len(held):
            used = dict.fromkeys(held, 0)
            for j in jobs:
                for n, g in j.allocation.nodes if j.allocation else ():
                    used[n] = used.get(n, 0) + g
            held = sorted(held, key=lambda n: (-used[n], n))[:want]
        else:
            free = [n for n in range(self.cluster.num_nodes) if n not in self._nodes]
            held += free[: want - len(held)]
        self._nodes = tuple(sorted(held))
        return self._nodes


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


def make_fleet(
    cluster: Cluster, autoscale: str | None, spot_rate: float, seed: int,
    scale: ScaleConfig | None = None,
) -> Fleet:
    """The fleet the CLI flags ask for: ``--autoscale MIN:MAX [--scale-rule R]``,
    ``--spot RATE``."""
    if autoscale:
        lo, _, hi = autoscale.partition(":")
        if not (lo.isdigit() and hi.isdigit()):
            raise ConfigError(f"--autoscale wants MIN:MAX node counts, but got {autoscale!r}")
        nodes = (cluster.nodes[0],) * int(hi)
        cluster = Cluster(nodes)
        return AutoscaleFleet(cluster, int(lo), scale)
    if spot_rate > 0:
        kind = NodeType(SPOT.name, cluster.gpus_per_node, SPOT.price_per_hour, True)
        return SpotFleet(Cluster((kind,) * cluster.num_nodes), spot_rate, seed)
    return FixedFleet(cluster)
