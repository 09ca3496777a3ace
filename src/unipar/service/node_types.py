"""Node types of a live Ray cluster, for the mixed-cluster scheduler (pure: no Ray).

A node declares how many workers of each type it holds as a Ray custom resource named
``unipar_type_<name>`` (``ray start --resources='{"unipar_type_a100": 8}'``, or
``ray.init(resources=...)``): one unit per worker. The service reads them from
``ray.nodes()`` into the :class:`~unipar.sched.typed_cluster.TypedCluster` the typed
policies schedule (the same model ``unipar simulate --cluster`` uses), and a worker of a
job placed on type ``a100`` asks Ray for ``{"unipar_type_a100": 1}`` besides its CPU, so
Ray puts it on a node of that type. A cluster with no such resource has no types: the
service schedules it as one pool.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from unipar.errors import ConfigError
from unipar.sched.typed_cluster import GpuType, NodeGroup, TypedCluster

TYPE_PREFIX = "unipar_type_"
_GIB = 2.0**30


def type_resource(name: str) -> dict[str, float]:
    """What one worker of type ``name`` asks Ray for besides its CPU ({} for no type)."""
    return {TYPE_PREFIX + name: 1.0} if name else {}


def type_held(resources: Mapping[str, float]) -> str:
    """The node type whose resource Ray assigned a worker ("" for none)."""
    return next((name[len(TYPE_PREFIX):] for name, amount in sorted(resources.items())
                 if name.startswith(TYPE_PREFIX) and amount > 0), "")


def typed_cluster(nodes: Sequence[Mapping[str, Any]]) -> TypedCluster | None:
    """The node types the live nodes of ``nodes`` (``ray.nodes()``) declare, as groups of
    nodes: a type's group has its nodes' count and, per node, the fewest workers one of
    them declares (no room is promised that a node lacks). The memory per worker stands
    in for a GPU's (it is what one worker of these nodes has). ``None``: no types."""
    slots: dict[str, list[tuple[int, float]]] = {}
    for node in nodes:
        if not node.get("Alive"):
            continue
        resources = node.get("Resources", {})
        for name, amount in resources.items():
            if name.startswith(TYPE_PREFIX) and int(amount) >= 1:
                memory = float(resources.get("memory", _GIB)) / _GIB / int(amount)
                slots.setdefault(name[len(TYPE_PREFIX):], []).append((int(amount), memory))
    if not slots:
        return None
    return TypedCluster(tuple(
        NodeGroup(GpuType(name, f"Ray nodes with resource {TYPE_PREFIX}{name}",
                          min(n for n, _ in held), max(min(m for _, m in held), 1e-3)),
                  len(held))
        for name, held in sorted(slots.items())
    ))


def check_throughput(job: str, throughput: Mapping[str, float] | None,
                     known: Sequence[str]) -> dict[str, float] | None:
    """A job's declared samples per second on one worker of each node type, checked
    against the cluster's types ``known`` (none: the cluster declares no types)."""
    if throughput is None:
        return None
    if not isinstance(throughput, Mapping) or not throughput:
        raise ConfigError(
            f"job {job!r}: throughput must map node types to samples per second on one "
            f"worker, such as {{'a': 100.0, 'b': 200.0}}, but got {throughput!r}"
        )
    for name, value in throughput.items():
        if name not in known:
            have = ", ".join(repr(k) for k in known) if known else "none (no node declares "\
                f"a {TYPE_PREFIX}<name> resource)"
            raise ConfigError(
                f"job {job!r} declares a throughput for node type {name!r}, which the cluster "
                f"does not have; its node types: {have}. Name one of them, or declare the "
                f"type on its nodes (ray start --resources='{{\"{TYPE_PREFIX}{name}\": N}}')"
            )
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
            raise ConfigError(
                f"job {job!r}: the throughput on node type {name!r} must be a positive number "
                f"of samples per second, but got {value!r}"
            )
    return {name: float(value) for name, value in throughput.items()}
