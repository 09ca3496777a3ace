"""The running Ray cluster as a :class:`ClusterSpec`, for ``--strategy auto``."""

from __future__ import annotations

import math

import ray

from unipar.cluster.hetero import RAY_ACCELERATOR_PRESETS, hetero_cluster_from_nodes
from unipar.cluster.learned_fit import learned_cluster
from unipar.cluster.spec import PRESETS, ClusterSpec
from unipar.errors import ResourceError


def live_cluster_spec(
    workers: int, *, cpus_per_worker: float = 1.0, gpus_per_worker: float = 0.0
) -> ClusterSpec:
    """``workers`` devices of the connected Ray cluster, as many per node as its largest
    node holds. GPUs take the preset of their type (Ray's ``accelerator_type``) as
    unipar's runtime trains on it (float32, eager:
    :meth:`~unipar.cluster.spec.ClusterSpec.as_trained_by_unipar`); CPU workers are this
    machine's CPU, calibrated once and cached. Either is corrected by what earlier runs
    on the same cluster measured (:func:`~unipar.cluster.learned_fit.learned_cluster`)."""
    return learned_cluster(_specified(workers, cpus_per_worker, gpus_per_worker))


def _specified(workers: int, cpus_per_worker: float, gpus_per_worker: float) -> ClusterSpec:
    nodes = [node["Resources"] for node in ray.nodes() if node.get("Alive")]
    if gpus_per_worker > 0:
        per_node = max(int(r.get("GPU", 0) // gpus_per_worker) for r in nodes)
    else:
        per_node = max(int(r.get("CPU", 0) // cpus_per_worker) for r in nodes)
    if per_node < 1:
        raise ResourceError(
            f"no Ray node can hold one worker (cpus_per_worker={cpus_per_worker}, "
            f"gpus_per_worker={gpus_per_worker}); lower them or add nodes"
        )
    devices_per_node = max(d for d in range(1, min(per_node, workers) + 1) if workers % d == 0)
    node_count = math.ceil(workers / devices_per_node)
    if gpus_per_worker > 0:
        types = {k.split(":", 1)[1] for r in nodes for k in r if k.startswith("accelerator_type:")}
        known = [RAY_ACCELERATOR_PRESETS[t] for t in sorted(types) if t in RAY_ACCELERATOR_PRESETS]
        preset = PRESETS[known[0] if known else "a100-80g"]
        return preset.as_trained_by_unipar().resized(node_count, devices_per_node)
    # measuring the CPU needs torch, which a GPU cluster's spec does without
    from unipar.cluster.calibrate import calibrated_cpu_cluster  # noqa: PLC0415 (heavy: torch)

    return calibrated_cpu_cluster(nodes=node_count, devices_per_node=devices_per_node)


def live_hetero_cluster(*, include_cpu_nodes: bool = False):  # type: ignore[no-untyped-def]
    """The connected Ray cluster as node groups by node type (accelerator type and
    count); CPU-only nodes as calibrated CPU workers if ``include_cpu_nodes``."""
    cpu = None
    if include_cpu_nodes:
        from unipar.cluster.calibrate import calibrated_cpu_cluster  # noqa: PLC0415 (heavy: torch)

        cpu = calibrated_cpu_cluster(nodes=1, devices_per_node=1)
    nodes = [node["Resources"] for node in ray.nodes() if node.get("Alive")]
    return hetero_cluster_from_nodes(nodes, cpu)
