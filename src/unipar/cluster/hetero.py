"""Heterogeneous clusters: node groups of different devices.

A group is ``nodes`` nodes of ``devices_per_node`` identical devices (a preset's device,
memory and links, with an optional price per device-hour). Written as
``"4xa100-80g+8xv100-16g"`` (``COUNTxPRESET`` parts joined by ``+``; a count that is
not a multiple of the preset's 8 devices per node is ``COUNTxPRESET/PER_NODE``), as YAML,
or read from the live Ray cluster's node types.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace
from typing import Any

import yaml

from unipar.cluster.spec import PRESETS, ClusterSpec, DeviceSpec, LinkSpec
from unipar.errors import ConfigError

_PART = re.compile(r"^(\d+)x([a-z0-9-]+?)(?:/(\d+))?$")


@dataclass(frozen=True)
class NodeGroup:
    """``nodes`` nodes of ``devices_per_node`` identical devices."""

    name: str
    cluster: ClusterSpec
    price_per_device_hour: float = 0.0

    @property
    def device(self) -> DeviceSpec:
        return self.cluster.device

    @property
    def count(self) -> int:
        return self.cluster.num_devices

    @property
    def intra_node(self) -> LinkSpec:
        return self.cluster.intra_node

    @property
    def inter_node(self) -> LinkSpec:
        return self.cluster.inter_node


@dataclass(frozen=True)
class HeteroCluster:
    """Node groups joined by ``inter_group`` (default: the slowest group network)."""

    groups: tuple[NodeGroup, ...]
    inter_group: LinkSpec | None = None

    def __post_init__(self) -> None:
        if not self.groups:
            raise ConfigError("a heterogeneous cluster needs at least one node group")
        names = [g.name for g in self.groups]
        if len(set(names)) != len(names):
            raise ConfigError(f"node group names must be unique, but got {names}")

    @property
    def num_devices(self) -> int:
        return sum(g.count for g in self.groups)

    @property
    def link_between_groups(self) -> LinkSpec:
        if self.inter_group is not None:
            return self.inter_group
        return min((g.inter_node for g in self.groups), key=lambda link: link.bandwidth)

    @property
    def price_per_hour(self) -> float:
        return sum(g.count * g.price_per_device_hour for g in self.groups)


def _group(name: str, preset: str, count: int, per_node: int | None, part: str) -> NodeGroup:
    if preset not in PRESETS:
        raise ConfigError(
            f"unknown device {preset!r} in cluster part {part!r}; known devices: "
            f"{', '.join(sorted(PRESETS))}"
        )
    base = PRESETS[preset]
    per_node = per_node or min(count, base.devices_per_node)
    if count < 1 or per_node < 1 or count % per_node:
        raise ConfigError(
            f"inconsistent node counts in cluster part {part!r}: {count} devices is not a "
            f"whole number of nodes of {per_node}; write COUNTx{preset}/PER_NODE with "
            "PER_NODE dividing COUNT"
        )
    return NodeGroup(name, base.resized(count // per_node, per_node))


def parse_hetero_cluster(text: str) -> HeteroCluster:
    """``"4xa100-80g+8xv100-16g"`` -> two groups (4 A100 on one node, 8 V100 on one)."""
    groups = []
    for index, part in enumerate(p.strip() for p in text.lower().split("+")):
        match = _PART.match(part)
        if not match:
            raise ConfigError(
                f"cluster part {part!r} of {text!r} is not COUNTxDEVICE[/PER_NODE] "
                '(e.g. "4xa100-80g+8xv100-16g")'
            )
        count, preset, per_node = match.groups()
        groups.append(
            _group(f"{index}:{preset}", preset, int(count), int(per_node or 0) or None, part)
        )
    return HeteroCluster(tuple(groups))


def hetero_cluster_from_dict(data: dict[str, Any]) -> HeteroCluster:
    """The YAML form: ``groups: [{device: a100-80g, nodes: 1, devices_per_node: 4,
    price_per_device_hour: 4.1, memory_gib: 80, intra_node_gbps: ..., inter_node_gbps:
    ...}]`` (``count`` may replace ``nodes``; bandwidths in GB/s)."""
    if not isinstance(data, dict) or not isinstance(data.get("groups"), list):
        raise ConfigError("a cluster file must hold a mapping with a list under 'groups'")
    groups = []
    for index, entry in enumerate(data["groups"]):
        part = f"groups[{index}]"
        if not isinstance(entry, dict) or "device" not in entry:
            raise ConfigError(f"cluster {part} must be a mapping with a 'device' key")
        preset = str(entry["device"]).lower()
        per_node = entry.get("devices_per_node")
        count = entry.get("count")
        nodes = entry.get("nodes")
        if nodes is not None and count is not None and nodes * (per_node or 1) != count:
            raise ConfigError(
                f"inconsistent node counts in cluster {part}: nodes={nodes} x "
                f"devices_per_node={per_node} != count={count}; give two of the three"
            )
        if count is None:
            count = (nodes or 1) * (
                per_node or PRESETS.get(preset, PRESETS["a100-80g"]).devices_per_node
            )
        group = _group(
            str(entry.get("name", f"{index}:{preset}")), preset, int(count), per_node, part
        )
        cluster = group.cluster
        if "memory_gib" in entry:
            cluster = replace(
                cluster, device=replace(cluster.device, memory_gib=float(entry["memory_gib"]))
            )
        for key, attr in (("intra_node_gbps", "intra_node"), ("inter_node_gbps", "inter_node")):
            if key in entry:
                link = replace(getattr(cluster, attr), bandwidth=float(entry[key]) * 1e9)
                cluster = replace(cluster, **{attr: link})
        groups.append(
            replace(
                group,
                cluster=cluster,
                price_per_device_hour=float(entry.get("price_per_device_hour", 0.0)),
            )
        )
    return HeteroCluster(tuple(groups))


def hetero_cluster_from_yaml(text: str) -> HeteroCluster:
    return hetero_cluster_from_dict(yaml.safe_load(text))


# Ray's accelerator_type resource names -> presets with that device.
RAY_ACCELERATOR_PRESETS = {
    "H100": "h100-80g",
    "H200": "h200-141g",
    "A100": "a100-80g",
    "A100-80G": "a100-80g",
    "A100-40G": "a100-40g",
    "V100": "v100-16g",
}


def hetero_cluster_from_nodes(
    nodes: list[dict[str, float]], cpu_cluster: ClusterSpec | None = None
) -> HeteroCluster:
    """Node groups from Ray nodes' resource dicts (``ray.nodes()[i]["Resources"]``):
    nodes of one accelerator type and GPU count form a group; nodes without GPUs form
    CPU groups of ``cpu_cluster``'s device (one worker per CPU), if given. GPU groups
    are priced as unipar's runtime trains on them
    (:meth:`~unipar.cluster.spec.ClusterSpec.as_trained_by_unipar`)."""
    shapes: dict[tuple[str, int], int] = {}
    for resources in nodes:
        gpus = int(resources.get("GPU", 0))
        types = [k.split(":", 1)[1] for k in resources if k.startswith("accelerator_type:")]
        if gpus:
            kind = types[0] if types else "A100"
            if kind not in RAY_ACCELERATOR_PRESETS:
                raise ConfigError(
                    f"unknown device {kind!r} on a Ray node (accelerator_type); known: "
                    f"{sorted(RAY_ACCELERATOR_PRESETS)}"
                )
            key = (RAY_ACCELERATOR_PRESETS[kind], gpus)
        elif cpu_cluster is not None and int(resources.get("CPU", 0)):
            key = ("cpu", int(resources["CPU"]))
        else:
            continue
        shapes[key] = shapes.get(key, 0) + 1
    groups = []
    for index, ((preset, per_node), count) in enumerate(sorted(shapes.items())):
        base = cpu_cluster if preset == "cpu" else PRESETS[preset].as_trained_by_unipar()
        assert base is not None
        groups.append(NodeGroup(f"{index}:{preset}", base.resized(count, per_node)))
    return HeteroCluster(tuple(groups))
