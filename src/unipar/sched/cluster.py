"""The cluster a scheduler shares: nodes of some types, each with GPUs and a price."""

from __future__ import annotations

from dataclasses import dataclass

from unipar.errors import ConfigError


@dataclass(frozen=True)
class NodeType:
    name: str
    gpus: int
    price_per_hour: float = 1.0  # per node
    preemptible: bool = False


ON_DEMAND = NodeType("on-demand", 4, price_per_hour=12.24)  # e.g. 4 x T4-class node, $/h
SPOT = NodeType("spot", 4, price_per_hour=3.67, preemptible=True)


@dataclass(frozen=True)
class Cluster:
    """Nodes in a fixed order (node i is ``nodes[i]``); all nodes hold the same GPU count."""

    nodes: tuple[NodeType, ...]

    def __post_init__(self) -> None:
        if not self.nodes:
            raise ConfigError("a cluster needs at least one node, but got none")
        counts = {n.gpus for n in self.nodes}
        if len(counts) != 1 or min(counts) < 1:
            raise ConfigError(
                f"every node must hold the same positive GPU count, but got {sorted(counts)}"
            )

    @classmethod
    def uniform(cls, num_nodes: int, gpus_per_node: int, node: NodeType = ON_DEMAND) -> Cluster:
        if num_nodes < 1 or gpus_per_node < 1:
            raise ConfigError(
                f"nodes and GPUs per node must be >= 1, but got {num_nodes} x {gpus_per_node}"
            )
        kind = NodeType(node.name, gpus_per_node, node.price_per_hour, node.preemptible)
        return cls((kind,) * num_nodes)

    @property
    def num_nodes(self) -> int:
        return len(self.nodes)

    @property
    def gpus_per_node(self) -> int:
        return self.nodes[0].gpus

    @property
    def total_gpus(self) -> int:
        return self.num_nodes * self.gpus_per_node
