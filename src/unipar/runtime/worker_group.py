"""A gang of :class:`TrainWorker` actors in one placement group, joined in one
``torch.distributed`` process group whose rendezvous the controller hands out."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import ray
from ray.util.placement_group import PlacementGroup, placement_group, remove_placement_group
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from unipar.errors import ResourceError
from unipar.job import Job
from unipar.plan import Plan
from unipar.ray_session import require_resources
from unipar.runtime.config import RunConfig
from unipar.runtime.trainer import CheckpointPolicy
from unipar.runtime.worker import TrainWorker


@dataclass(frozen=True)
class WorkerInfo:
    rank: int
    pid: int
    node_ip: str
    node_id: str


def check_cluster_resources(config: RunConfig) -> None:
    """Fail at once, before anything starts, when the cluster is too small in total."""
    needs = {"CPU": config.cpus_per_worker, "GPU": config.gpus_per_worker}
    require_resources(needs, config.workers, "worker")


class WorkerGroup:
    def __init__(self, job: Job, plan: Plan, config: RunConfig, checkpoints: CheckpointPolicy):
        self.config = config
        bundle = {"CPU": config.cpus_per_worker}
        if config.gpus_per_worker:
            bundle["GPU"] = config.gpus_per_worker
        self.placement: PlacementGroup = placement_group(
            [dict(bundle) for _ in range(config.workers)], strategy="PACK"
        )
        ready, _ = ray.wait([self.placement.ready()], timeout=config.placement_timeout_s)
        if not ready:
            remove_placement_group(self.placement)
            raise ResourceError(
                f"could not place {config.workers} workers of {bundle} within "
                f"{config.placement_timeout_s:g} s: the cluster's nodes do not have these "
                f"resources free (cluster: {ray.available_resources()}); use fewer workers or "
                "smaller ones"
            )
        actor = ray.remote(TrainWorker)
        self.workers = [
            actor.options(
                num_cpus=config.cpus_per_worker,
                num_gpus=config.gpus_per_worker,
                max_concurrency=2,
                max_restarts=0,
                scheduling_strategy=PlacementGroupSchedulingStrategy(
                    self.placement, placement_group_bundle_index=rank
                ),
            ).remote(
                job,
                plan,
                rank=rank,
                world_size=config.workers,
                threads=max(1, int(config.cpus_per_worker)),
                use_gpu=bool(config.gpus_per_worker),
                checkpoints=checkpoints,
            )
            for rank in range(config.workers)
        ]
        described = ray.get([w.describe.remote() for w in self.workers])
        self.info = [WorkerInfo(rank, *about) for rank, about in enumerate(described)]

    def setup_refs(self, resume_from: Path | None) -> list[ray.ObjectRef]:
        """Start the rendezvous and model building on every worker (non-blocking)."""
        port = ray.get(self.workers[0].reserve_port.remote())
        address = self.info[0].node_ip
        return [
            w.setup.remote(address, port, resume_from, self.config.collective_timeout_s)
            for w in self.workers
        ]

    def train_refs(self) -> list[ray.ObjectRef]:
        return [w.train.remote() for w in self.workers]

    def drain_refs(self) -> list[ray.ObjectRef]:
        return [w.drain.remote() for w in self.workers]

    def shutdown(self) -> None:
        for worker in self.workers:
            ray.kill(worker, no_restart=True)
        remove_placement_group(self.placement)
