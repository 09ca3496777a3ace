"""Which nodes exist each round, and what they cost (node-hours x price)."""

from __future__ import annotations

from collections.abc import Sequence

from unipar.sched.cluster import Cluster


class Fleet:
    """The nodes a round may use. ``available_nodes`` is called at the start of each round,
    ``account`` at its end (to charge the round's nodes)."""

    def __init__(self, cluster: Cluster) -> None:
        self.cluster = cluster
        self.cost = 0.0  # price units (per node-hour) x hours
        self.node_seconds = 0.0
        self._nodes: tuple[int, ...] = tuple(range(cluster.num_nodes))

    def available_nodes(self, now: float, jobs: Sequence) -> tuple[int, ...]:
        return self._nodes

    def account(self, now: float, interval: float) -> None:
        for n in self._nodes:
            self.cost += self.cluster.nodes[n].price_per_hour * interval / 3600.0
        self.node_seconds += len(self._nodes) * interval


class FixedFleet(Fleet):
    """Every node of the cluster, all the time."""
