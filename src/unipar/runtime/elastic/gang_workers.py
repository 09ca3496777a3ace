"""What one worker of a gang asks of Ray, and its actor's start: the elastic controller's
and the early start's (:mod:`~unipar.runtime.elastic.early_start`)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import ray

from unipar.job import Job
from unipar.ray_cluster.session import require_resources
from unipar.ray_cluster.supervisor import Supervisor
from unipar.runtime.config import RunConfig
from unipar.runtime.elastic.worker import ElasticWorker
from unipar.runtime.step_records import CheckpointPolicy


def worker_needs(config: RunConfig) -> dict[str, float]:
    """The resources Ray reserves for one worker (those it takes any of)."""
    needs = {"CPU": config.cpus_per_worker, "GPU": config.gpus_per_worker}
    return {name: amount for name, amount in needs.items() if amount}


def worker_actor(config: RunConfig, resources: dict[str, float], job: Job | None = None,
                 checkpoints: CheckpointPolicy | None = None) -> Any:
    """One gang worker's actor (its process starting), holding a worker's CPUs and GPUs
    and ``resources``; without ``job``, started early (:mod:`.early_start`)."""
    return (
        ray.remote(ElasticWorker)
        .options(
            num_cpus=config.cpus_per_worker,
            num_gpus=config.gpus_per_worker,
            resources=dict(resources),
            max_restarts=0,
        )
        .remote(
            job,
            threads=max(1, int(config.cpus_per_worker)),
            use_gpu=bool(config.gpus_per_worker),
            checkpoints=checkpoints,
        )
    )


def room_for_workers(config: RunConfig) -> int:
    """How many more workers the free resources of live, non-draining nodes hold."""
    return Supervisor(lambda: None, worker_needs(config)).room()


def check_cluster_resources(config: RunConfig) -> None:
    """Fail at once, before anything starts, when the cluster is too small in total."""
    require_resources(worker_needs(config), config.least_workers, "worker")


def unused_gpus_note(config: RunConfig, total: Mapping[str, float] | None = None) -> str | None:
    """A line for a run that reserves no GPU on a cluster that has some (``total``: the
    cluster's resources, default the connected Ray cluster's): unipar trains where it is
    told to, and a first run on a GPU machine would otherwise train on its CPUs unsaid."""
    gpus = (ray.cluster_resources() if total is None else total).get("GPU", 0.0)
    if config.gpus_per_worker or gpus < 1:
        return None
    return (
        f"unipar: the Ray cluster has {gpus:g} GPU{'' if gpus == 1 else 's'} and this run "
        "uses none (gpus_per_worker=0); --gpus-per-worker 1, or fit(..., "
        "gpus_per_worker=1), trains on them"
    )
