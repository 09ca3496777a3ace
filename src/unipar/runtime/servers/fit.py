"""``fit`` for a plan on parameter servers: start the servers and workers
(:mod:`unipar.runtime.servers.for_job`), show progress from the servers' applied step, write the
metrics and the trained model. A server killed mid-run is restarted by Ray from its
latest snapshot (every ``checkpoint_every`` steps) and the workers carry on."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import ray
import torch

from unipar.job import Job
from unipar.plan.representation import Plan
from unipar.runtime.config import RunConfig
from unipar.runtime.metrics import MetricsWriter, StepMetrics
from unipar.runtime.progress import ProgressBar
from unipar.runtime.servers.for_job import history_of, start_job_on_servers

MODEL_FILE = "model.pt"  # the trained model's consolidated state dict (torch.save)


@dataclass(frozen=True)
class ServersOutcome:
    history: tuple[StepMetrics, ...]
    model_path: Path
    servers: int


def alive_nodes() -> int:
    return sum(1 for node in ray.nodes() if node.get("Alive"))


def run_on_servers(
    job: Job, plan: Plan, config: RunConfig, metrics: MetricsWriter
) -> ServersOutcome:
    """Train ``job`` with ``plan`` (``grad_sync='parameter_server'``): one server per
    node of the connected cluster, BSP."""
    servers = max(1, alive_nodes())
    directory = config.checkpoints
    run = start_job_on_servers(
        job,
        plan,
        servers=servers,
        snapshot_dir=str(directory / "servers"),
        snapshot_every=config.checkpoint_interval(job.steps),
    )
    bar = ProgressBar(job.steps, enabled=config.progress)
    try:
        while not run.poll(0.5):  # raises a worker's error (and stops the run)
            bar.start_at(min(s["applied"] for s in run.server_status()))
        result = run.result()
    finally:
        bar.close()
    sample = job.dataset()[0][1]
    history = history_of(job, result, sample.numel() if torch.is_tensor(sample) else 1)
    for step in history:
        metrics.write(step)
    model_path = directory / MODEL_FILE
    torch.save(result.params, model_path)
    return ServersOutcome(history, model_path, servers)
