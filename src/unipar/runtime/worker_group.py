"""A gang of :class:`TrainWorker` actors in one placement group, joined in one
``torch.distributed`` process group whose rendezvous the controller hands out."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import ray
from ray.util.placement_group import PlacementGroup, remove_placement_group
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from unipar.job import Job
from unipar.plan import Plan
from unipar.ray_cluster.session import require_resources, reserve_bundles
from unipar.runtime.config import RunConfig
from unipar.runtime.tracing import steps_traced
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
    require_resources(needs, config.least_workers, "worker")


class WorkerGroup:
    def __init__(self, job: Job, plan: Plan, config: RunConfig, checkpoints: CheckpointPolicy):
        self.config, self.job = config, job
        bundle = {"CPU": config.cpus_per_worker}
        if config.gpus_per_worker:
            bundle["GPU"] = config.gpus_per_worker
        self.placement: PlacementGroup = reserve_bundles(
            bundle, config.workers, "worker", timeout_s=config.placement_timeout_s
        )
        actor = ray.remote(TrainWorker)
        self.workers = [
            actor.options(
                num_cpus=config.cpus_per_worker,
                num_gpus=config.gpus_per_worker,
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

    def train_streams(self) -> list[ray.ObjectRefGenerator]:
        """Start training on every worker; each yields its step reports (and, tracing,
        its records), then its outcome."""
        traced = steps_traced(self.config.trace_steps, self.job)
        return [w.train.remote(traced) for w in self.workers]

    def shutdown(self) -> None:
        for worker in self.workers:
            ray.kill(worker, no_restart=True)
        remove_placement_group(self.placement)
