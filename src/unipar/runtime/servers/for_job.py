"""A :class:`~unipar.job.Job` trained on parameter servers: what ``fit`` runs for a plan
whose ``grad_sync`` is ``parameter_server`` (the planner picks it for models whose
embedding tables dominate; see :mod:`unipar.plan.grad_sync`).

Each of the plan's ``dp`` workers computes its slice of every global batch (the samples
:class:`~unipar.data.sampler.GlobalBatchSampler` gives it, as under all-reduce), pulls
the rows its batch touches and the dense tensors, and pushes gradients; the servers
(one per node of the cluster, at least one) average the pushes of a step and run the
optimizer (BSP), so a step equals one process's step on the whole global batch.
"""

from __future__ import annotations

import functools
import time
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from unipar.data.batch import collate
from unipar.data.sampler import GlobalBatchSampler
from unipar.errors import ConfigError
from unipar.job import Job, ModelCall
from unipar.optimizer import OptimizerSpec, ScheduleKind
from unipar.plan.grad_sync import parameter_facts
from unipar.plan.representation import Plan
from unipar.plan.runtime_support import check_servers_plan
from unipar.plan.sync_cost import WORTH_SERVING_SHARE
from unipar.ps.optim import server_rule
from unipar.runtime.metrics import StepMetrics
from unipar.runtime.servers.train import PSConfig, PSResult, PSRun


def server_optimizer(job: Job) -> OptimizerSpec:
    """``job``'s optimizer, which the servers run: SGD without momentum, or Adagrad, Adam
    or AdamW with no weight decay (rows are updated lazily, as ``torch.optim.SparseAdam``),
    at a constant learning rate, with no clipping and a fixed batch."""
    spec = job.optimizer
    rules = []
    if not isinstance(spec, OptimizerSpec):
        rules.append("the optimizer must be an OptimizerSpec (a factory cannot run on servers)")
    elif server_rule(spec) is not None:
        rules.append(server_rule(spec))
    if job.lr_schedule.kind is not ScheduleKind.CONSTANT or job.lr_schedule.warmup_steps:
        rules.append(
            f"servers keep a constant learning rate, but the job has a "
            f"{job.lr_schedule.kind.value} schedule with {job.lr_schedule.warmup_steps} warmup "
            "steps"
        )
    if job.grad_clip_norm is not None:
        rules.append(f"servers do not clip gradients, but grad_clip_norm={job.grad_clip_norm}")
    if job.adaptive is not None:
        rules.append("servers train at a fixed batch, but the job adapts its batch")
    if rules:
        raise ConfigError(
            "a parameter-server plan cannot run this job: "
            + "; ".join(rules)
            + "; change the job, or pass grad_sync='all_reduce' (or plan='ddp')"
        )
    assert isinstance(spec, OptimizerSpec)
    return spec


def check_worth_serving_job(meta_model: nn.Module) -> None:
    """Refuse servers for a model (built on the meta device) whose embedding tables (not
    tied to another layer) hold under half the parameters: pulls and pushes would move
    about as many bytes as an all-reduce."""
    facts = parameter_facts(meta_model)
    if facts.table_share < WORTH_SERVING_SHARE:
        raise ConfigError(
            f"nothing worth a parameter server: the model's embedding tables hold "
            f"{facts.table_share:.0%} of its {facts.table_params + facts.dense_params:,} "
            f"parameters (< {WORTH_SERVING_SHARE:.0%}; tied tables count as dense); pass "
            "grad_sync='all_reduce', or plan='auto' to let the planner choose"
        )


@dataclass(frozen=True)
class JobBatches:
    """``(worker, clock) -> (inputs, targets)``: worker ``w``'s slice of global batch
    ``clock - 1``, as the all-reduce runtime deals it."""

    dataset: Any  # the job's dataset factory
    global_batch_size: int
    seed: int
    workers: int
    collate: Any = None  # the job's collate function (None: default_collate)
    _cache: dict = field(default_factory=dict, compare=False, repr=False)

    def __call__(self, worker: int, clock: int) -> tuple[torch.Tensor, torch.Tensor]:
        if "data" not in self._cache:
            data = self.dataset()
            self._cache["data"] = data
            self._cache["sampler"] = GlobalBatchSampler(
                len(data), self.global_batch_size, self.seed
            )
        data, sampler = self._cache["data"], self._cache["sampler"]
        indices = sampler.shard_indices(clock - 1, worker, self.workers)
        return collate([data[int(i)] for i in indices], self.collate)


def _job_loss(loss: Any, call: ModelCall, model: nn.Module, batch: tuple[Any, Any]) -> Any:
    inputs, targets = batch
    return loss(call(model, inputs), targets)


def start_job_on_servers(
    job: Job, plan: Plan, *, servers: int, snapshot_dir: str, snapshot_every: int
) -> PSRun:
    """Start ``job`` on ``plan.mesh.dp`` workers and ``servers`` servers (BSP)."""
    check_servers_plan(plan)
    config = PSConfig(
        num_servers=servers,
        optimizer=server_optimizer(job),
        snapshot_dir=snapshot_dir,
        snapshot_every=snapshot_every,
    )
    workers = plan.mesh.dp
    data = JobBatches(job.dataset, job.global_batch_size, job.seed, workers, job.collate)
    torch.manual_seed(job.seed)  # the model's initial weights, as the other runtimes
    return PSRun(
        job.model,
        data,
        functools.partial(_job_loss, job.loss, job.call),
        workers=workers,
        steps=job.steps,
        config=config,
    )


def history_of(job: Job, result: PSResult, tokens_per_sample: int) -> tuple[StepMetrics, ...]:
    """One :class:`StepMetrics` per step: the workers' mean loss (each a mean over an
    equal slice, so the global batch's mean), the slowest worker's time."""
    lr = job.optimizer.lr if isinstance(job.optimizer, OptimizerSpec) else float("nan")
    tokens = job.global_batch_size * tokens_per_sample
    out = []
    now = time.time()
    for step in range(min(len(losses) for losses in result.losses)):
        seconds = max(times[step] for times in result.step_s)
        out.append(
            StepMetrics(
                step=step,
                loss=sum(losses[step] for losses in result.losses) / len(result.losses),
                lr=lr,
                samples=job.global_batch_size,
                tokens=tokens,
                step_time_s=seconds,
                tokens_per_s=tokens / seconds if seconds else 0.0,
                attempt=0,
                finished_at=now,
            )
        )
    return tuple(out)
