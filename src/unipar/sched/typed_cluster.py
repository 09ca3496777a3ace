"""A shared cluster of several GPU types: groups of nodes, each node holding GPUs of one type.

Sia's setting (Jayaram Subramanya et al., SOSP'23, §2 and its simulator's
``simulator_config.py``): a job runs on one GPU type at a time; its speed on each type is
a different function of its GPU count and batch. A type is named as its measured traces
are (``placements-aws.csv`` is type ``aws``). Nodes are numbered in group order, so node
``i`` of ``6xaws+2xdgx-ext`` is an ``aws`` node for ``i < 6``.

Written on the command line as ``6xaws+2xdgx-ext+3xrtx`` (``NODESxTYPE`` parts joined by
``+``; the count is of *nodes*, unlike ``unipar plan``'s device counts), or read from a
CSV file with the columns ``type,nodes`` and, to define a type not in :data:`KNOWN_TYPES`,
``gpus_per_node`` and ``memory_gib`` (optional: ``device``, ``price_per_hour``,
``max_nodes_per_job``).

This is the model the live shared-cluster service is meant to share: a
:class:`TypedCluster` of :class:`GpuType` groups, allocations on one type
(:class:`TypedAllocation`), and per-type throughput models fitted from measured step times
(:mod:`unipar.goodput.throughput`).
"""

from __future__ import annotations

import csv
import re
from dataclasses import dataclass, replace
from pathlib import Path

from unipar.errors import ConfigError


@dataclass(frozen=True)
class GpuType:
    """One GPU type: its nodes' GPU count and memory, and a price per node-hour."""

    name: str
    device: str
    gpus_per_node: int
    memory_gib: float
    price_per_hour: float | None = None  # per node, $/h; None where no public price exists
    # the most nodes one job may span (the traces measured that many; None: any)
    max_nodes_per_job: int | None = None

    def __post_init__(self) -> None:
        if self.gpus_per_node < 1 or self.memory_gib <= 0:
            raise ConfigError(
                f"GPU type {self.name!r} needs gpus_per_node >= 1 and memory_gib > 0, but got "
                f"{self.gpus_per_node} and {self.memory_gib}"
            )


# The node types of Sia's traces (its ``simulator_config.py``: GPUs per node, and the most
# nodes profiled per type as ``cluster_max_physical_nnodes``). Prices: AWS on-demand
# us-east-1, g4dn.12xlarge (4 x T4) and p4d.24xlarge (8 x A100-40GB, standing in for a
# DGX-A100); the on-premise RTX nodes have none.
KNOWN_TYPES: dict[str, GpuType] = {
    t.name: t
    for t in (
        GpuType("aws", "T4 16GB (g4dn.12xlarge)", 4, 16.0, 3.912, 16),
        GpuType("dgx-ext", "A100-SXM4-40GB (DGX-A100, NVLink)", 8, 40.0, 32.77, 2),
        GpuType("rtx", "RTX 2080Ti 11GB", 8, 11.0, None, 3),
        GpuType("quad", "Quadro RTX 6000 24GB", 4, 24.0, None, 1),
    )
}


@dataclass(frozen=True)
class NodeGroup:
    gpu_type: GpuType
    nodes: int


@dataclass(frozen=True)
class TypedAllocation:
    """GPUs of one type: ``(node, gpus)`` pairs, nodes numbered as in the cluster.

    The batch size is the job's own to choose for these GPUs (its runtime's adaptive
    batch); a policy scores a configuration at its best batch.
    """

    gpu_type: str
    nodes: tuple[tuple[int, int], ...]

    @property
    def replicas(self) -> int:
        return sum(g for _, g in self.nodes)

    @property
    def placement(self) -> tuple[int, ...]:
        """GPUs used per node, in node order."""
        return tuple(g for _, g in sorted(self.nodes))


@dataclass(frozen=True)
class TypedCluster:
    """Node groups of distinct GPU types, in a fixed order."""

    groups: tuple[NodeGroup, ...]

    def __post_init__(self) -> None:
        if not self.groups:
            raise ConfigError("a cluster needs at least one node group, but got none")
        names = [g.gpu_type.name for g in self.groups]
        twice = sorted({n for n in names if names.count(n) > 1})
        if twice:
            raise ConfigError(
                f"each GPU type may appear once in a cluster, but {twice} appear twice: add "
                "their node counts into one part"
            )
        for g in self.groups:
            if g.nodes < 1:
                raise ConfigError(
                    f"GPU type {g.gpu_type.name!r} needs at least one node, but got {g.nodes}"
                )

    @property
    def types(self) -> tuple[GpuType, ...]:
        return tuple(g.gpu_type for g in self.groups)

    @property
    def type_names(self) -> tuple[str, ...]:
        return tuple(g.gpu_type.name for g in self.groups)

    def gpu_type(self, name: str) -> GpuType:
        for g in self.groups:
            if g.gpu_type.name == name:
                return g.gpu_type
        raise ConfigError(f"no GPU type {name!r} in the cluster; it has {self.type_names}")

    def job_nodes(self, name: str) -> int:
        """The most nodes of type ``name`` one job may span: all of them, or the type's
        ``max_nodes_per_job`` where that is smaller."""
        nodes = len(self.nodes_of(name))
        limit = self.gpu_type(name).max_nodes_per_job
        return min(nodes, limit) if limit else nodes

    def nodes_of(self, name: str) -> range:
        """Global numbers of the nodes of type ``name``."""
        start = 0
        for g in self.groups:
            if g.gpu_type.name == name:
                return range(start, start + g.nodes)
            start += g.nodes
        raise ConfigError(f"no GPU type {name!r} in the cluster; it has {self.type_names}")

    def type_of(self, node: int) -> GpuType:
        start = 0
        for g in self.groups:
            if node < start + g.nodes:
                return g.gpu_type
            start += g.nodes
        raise ConfigError(f"node {node} is not in the cluster of {self.num_nodes} nodes")

    def gpus(self, name: str) -> int:
        return len(self.nodes_of(name)) * self.gpu_type(name).gpus_per_node

    @property
    def num_nodes(self) -> int:
        return sum(g.nodes for g in self.groups)

    @property
    def total_gpus(self) -> int:
        return sum(g.nodes * g.gpu_type.gpus_per_node for g in self.groups)

    def scaled(self, factor: int) -> TypedCluster:
        """``factor`` times the nodes of every type."""
        return TypedCluster(tuple(replace(g, nodes=g.nodes * factor) for g in self.groups))

    def describe(self) -> str:
        return "+".join(f"{g.nodes}x{g.gpu_type.name}" for g in self.groups)


_PART = re.compile(r"^(\d+)x([A-Za-z0-9_.-]+)$")


def _known(name: str, where: str) -> GpuType:
    if name not in KNOWN_TYPES:
        raise ConfigError(
            f"{where}: unknown GPU type {name!r}; known: {', '.join(sorted(KNOWN_TYPES))}. "
            "Define a new type in a cluster file (columns type,nodes,gpus_per_node,"
            "memory_gib) with traces placements-TYPE.csv and scalability-TYPE.csv"
        )
    return KNOWN_TYPES[name]


def parse_cluster(text: str) -> TypedCluster:
    """``"6xaws+2xdgx-ext+3xrtx"`` -> 6 aws nodes, 2 dgx-ext nodes, 3 rtx nodes."""
    groups = []
    for part in (p.strip() for p in text.split("+")):
        match = _PART.match(part)
        if not match:
            raise ConfigError(
                f"cluster part {part!r} of {text!r} is not NODESxTYPE (e.g. "
                '"6xaws+2xdgx-ext+3xrtx": 6 nodes of type aws, ...)'
            )
        nodes, name = int(match.group(1)), match.group(2)
        groups.append(NodeGroup(_known(name, f"cluster part {part!r}"), nodes))
    return TypedCluster(tuple(groups))


def _row_number(path: Path, line: int, row: dict, column: str, kind: type):
    text = row.get(column)
    try:
        value = kind(text)
    except (TypeError, ValueError):
        raise ConfigError(
            f"{path}:{line}: column {column!r} must be a {kind.__name__}, but got {text!r}"
        ) from None
    if value <= 0:
        raise ConfigError(f"{path}:{line}: column {column!r} must be positive, but got {text!r}")
    return value


def read_cluster(path: Path) -> TypedCluster:
    """A cluster file: CSV ``type,nodes[,gpus_per_node,memory_gib,device,price_per_hour,
    max_nodes_per_job]``; errors name the file and line of the bad row."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"cluster file {path} does not exist")
    with path.open(newline="") as f:
        reader = csv.DictReader(f)
        missing = [c for c in ("type", "nodes") if c not in (reader.fieldnames or [])]
        if missing:
            raise ConfigError(
                f"{path}:1: header must name the columns type,nodes, but {missing} missing "
                f"(got {reader.fieldnames})"
            )
        groups = []
        for row in reader:
            line = reader.line_num
            name = (row.get("type") or "").strip()
            nodes = int(_row_number(path, line, row, "nodes", int))
            if row.get("gpus_per_node") or row.get("memory_gib"):
                base = KNOWN_TYPES.get(name)
                gpu_type = GpuType(
                    name,
                    row.get("device") or (base.device if base else name),
                    int(_row_number(path, line, row, "gpus_per_node", int)),
                    float(_row_number(path, line, row, "memory_gib", float)),
                    float(_row_number(path, line, row, "price_per_hour", float))
                    if row.get("price_per_hour") else (base.price_per_hour if base else None),
                    int(_row_number(path, line, row, "max_nodes_per_job", int))
                    if row.get("max_nodes_per_job")
                    else (base.max_nodes_per_job if base else None),
                )
            else:
                gpu_type = _known(name, f"{path}:{line}")
            groups.append(NodeGroup(gpu_type, nodes))
    if not groups:
        raise ConfigError(f"{path}: the cluster file has no rows")
    return TypedCluster(tuple(groups))


def load_cluster(spec: str) -> TypedCluster:
    """``spec``: a cluster file (it exists) or a ``NODESxTYPE+...`` string."""
    path = Path(spec)
    if path.suffix == ".csv" or path.is_file():
        return read_cluster(path)
    return parse_cluster(spec)
