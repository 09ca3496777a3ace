"""How many actors, with how many CPUs and GPUs, from ``RayParams`` and the cluster's
nodes (pure logic: no Ray). Defaults follow XGBoost-Ray's README ("How many remote actors should I
use?"): for CPU training there is no benefit in more than one actor per node, since
xgboost already uses all of a node's CPUs with threads."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from unipar.errors import ConfigError
from unipar.xgboost.params import RayParams


@dataclass(frozen=True)
class ActorResources:
    num_actors: int
    cpus_per_actor: int
    gpus_per_actor: int
    strategy: str  # placement group strategy
    first_bundle: int = 0  # in the caller's placement group: the first actor's bundle


def wants_gpu(params: Mapping[str, Any]) -> bool:
    """Whether xgboost ``params`` train on a GPU (``device="cuda[:i]"``/``"gpu"``, or the
    older ``tree_method="gpu_hist"``)."""
    device = str(params.get("device") or "")
    tree_method = str(params.get("tree_method") or "")
    return device.startswith(("cuda", "gpu")) or tree_method.startswith("gpu")


def plan_actors(
    ray_params: RayParams, nodes: Sequence[Mapping[str, float]], params: Mapping[str, Any]
) -> ActorResources:
    """``nodes``: each alive node's total resources (``{"CPU": 8, "GPU": 1, ...}``).

    - ``num_actors=0``: one actor per node that has CPUs, spread one per node;
    - ``cpus_per_actor=0``: the cluster's CPUs divided over the actors, at most the
      smallest node's (so every actor fits on any node), at least 1;
    - ``gpus_per_actor=-1``: 1 when ``params`` train on GPU and the cluster has a GPU
      for every actor, else 0."""
    cpu_nodes = [n for n in nodes if n.get("CPU", 0) >= 1]
    if not cpu_nodes:
        raise ConfigError("the Ray cluster has no node with a CPU; add a node with CPUs")
    default_count = ray_params.num_actors == 0
    num_actors = ray_params.num_actors or len(cpu_nodes)
    strategy = "SPREAD" if default_count and len(cpu_nodes) > 1 else "PACK"
    strategy = (ray_params.placement_options or {}).get("strategy", strategy)
    cpus = ray_params.cpus_per_actor
    if cpus == 0:
        smallest = int(min(n["CPU"] for n in cpu_nodes))
        total = int(sum(n["CPU"] for n in cpu_nodes))
        cpus = max(1, min(smallest, total // num_actors))
    gpus = ray_params.gpus_per_actor
    if gpus == -1:
        cluster_gpus = sum(int(n.get("GPU", 0)) for n in nodes)
        gpus = 1 if wants_gpu(params) and cluster_gpus >= num_actors else 0
    return ActorResources(num_actors, cpus, gpus, strategy)


def plan_in_bundles(
    ray_params: RayParams, bundles: Sequence[Mapping[str, float]], caller_holds: bool
) -> ActorResources | None:
    """Inside the caller's placement group (a Ray Tune trial made with
    ``RayParams.get_tune_resources``): the actors in its bundles, from the first one (or
    the second when the caller holds resources in the first), all alike; ``None`` when
    they do not fit (the actors then get a placement group of their own)."""
    first_bundle = 1 if caller_holds else 0
    actor_bundles = [dict(b) for b in bundles[first_bundle:]]
    if not actor_bundles or any(b != actor_bundles[0] for b in actor_bundles):
        return None
    each = actor_bundles[0]
    num_actors = ray_params.num_actors or len(actor_bundles)
    cpus = ray_params.cpus_per_actor or int(each.get("CPU", 0))
    gpus = ray_params.gpus_per_actor if ray_params.gpus_per_actor >= 0 else int(each.get("GPU", 0))
    fits = num_actors <= len(actor_bundles) and 1 <= cpus <= each.get("CPU", 0)
    if not fits or gpus > each.get("GPU", 0):
        return None
    return ActorResources(num_actors, cpus, gpus, "PACK", first_bundle)
