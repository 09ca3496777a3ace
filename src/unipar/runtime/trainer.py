"""One worker's training: build, load, step, report, checkpoint. No Ray in here.

The controller runs one :class:`Trainer` per worker process; a single process with
``world_size=1`` runs the same code.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from unipar.adapt.state import AdaptState
from unipar.data.batch import Batch, collate, to_device, tokens_per_sample
from unipar.data.sampler import GlobalBatchSampler, ShardedBatches
from unipar.errors import ConfigError, UserCodeError
from unipar.job import Job
from unipar.plan import Plan
from unipar.runtime.adaptive import AdaptiveStep, saved_adapt_state
from unipar.runtime.checkpoint import load_checkpoint, read_checkpoint, save_checkpoint
from unipar.runtime.parallel.clipping import clip_grad_norm
from unipar.runtime.parallel.data import apply_ddp
from unipar.runtime.parallel.distributed_optimizer import build_optimizer
from unipar.runtime.parallel.parallelize import ParallelModel, device_mesh_for, parallelize
from unipar.runtime.step_context import step_context
from unipar.runtime.step_records import CheckpointPolicy, StepReport
from unipar.runtime.tracing import (
    Attachment,
    StepTracer,
    TraceBatch,
    attach_tracer,
    trace_window,
    traced_step,
    traces,
)


def _call_user(what: str, fn: Callable[[], object]) -> object:
    try:
        return fn()
    except Exception as error:
        raise UserCodeError(f"the job's {what} raised {type(error).__name__}: {error}") from error


class Trainer:
    def __init__(
        self,
        job: Job,
        plan: Plan,
        *,
        rank: int,
        world_size: int,
        device: torch.device,
        checkpoints: CheckpointPolicy,
        dataset: object = None,
    ) -> None:
        """``dataset``: the job's dataset if this process built it already (a worker
        re-formed into a new gang keeps it)."""
        self.job, self.plan = job, plan
        self.dataset = dataset
        self.rank, self.world_size = rank, world_size
        self.device = device
        self.checkpoints = checkpoints
        self.start_step = 0
        self.tracer: StepTracer | None = None
        self._attachment: Attachment | None = None
        self.adapt: AdaptiveStep | None = None

    def setup(self, resume_from: Path | None, adapt_state: AdaptState | None = None) -> int:
        """Build model, optimizer and data; load ``resume_from``. Returns the first step.
        ``adapt_state``: the adaptive batch's state when it comes from elsewhere (a
        snapshot in memory) rather than from ``resume_from``; the adaptive step is built
        once (it registers DDP's communication hook, which DDP takes once)."""
        job = self.job
        self._load_dataset()
        self.model = parallelize(
            self._build_model,
            self.plan,
            rank=self.rank,
            world_size=self.world_size,
            device=self.device,
            loss_fn=job.loss,
            sample=self._sample(),
            seed=job.seed,
            call=job.call,
            mesh_for_step=job.step is not None,
        )
        self.loss_of = self._loss_of()
        self.optimizers = [
            _call_user("optimizer", lambda part=part: self._optimizer(part))
            for part in self.model.parts
        ]
        self.base_lrs = [[g["lr"] for g in opt.param_groups] for opt in self.optimizers]
        self._shard_batches()
        if resume_from is not None:
            info = read_checkpoint(resume_from)
            if info.global_batch_size != job.global_batch_size:
                raise ConfigError(
                    f"resuming needs the global batch the checkpoint was written with, but "
                    f"the checkpoint has global_batch_size={info.global_batch_size} and the job "
                    f"{job.global_batch_size}; use {info.global_batch_size} or start afresh"
                )
            load_checkpoint(resume_from, parts=self.model.parts, optimizers=self.optimizers)
            self.start_step = info.step
        self.adapt_from(adapt_state if adapt_state is not None else saved_adapt_state(resume_from))
        return self.start_step

    def adapt_from(self, state: AdaptState | None) -> None:
        """With ``job.adaptive``: adapt the batch from ``state`` (None: from M0 at the
        data's start)."""
        if self.job.adaptive is not None:
            self.adapt = AdaptiveStep(
                self.job, self.plan, model=self.model, dataset_size=len(self.dataset), state=state
            )

    def _optimizer(self, part: nn.Module) -> torch.optim.Optimizer:
        return build_optimizer(
            self.job.build_optimizer, part, self.plan, rank=self.rank, world_size=self.world_size
        )

    def _load_dataset(self) -> None:
        if self.dataset is None:
            self.dataset = _call_user("dataset factory", self.job.dataset)

    def _shard_batches(self) -> None:
        sampler = GlobalBatchSampler(len(self.dataset), self.job.global_batch_size, self.job.seed)
        self.batches = ShardedBatches(
            sampler,
            self.model.data_replica,
            self.plan.mesh.data_replicas,
            self.plan.microbatch_size,
            self.plan.replica_samples,
        )

    def adopt(self, previous: Trainer, step: int) -> int:
        """Continue ``previous``'s model and optimizers (a replica at ``step`` under a
        replicated plan) under this trainer's replicated plan: the same parameters, only
        re-wrapped for the new process group; nothing is built, copied or loaded."""
        self.dataset = previous.dataset
        module = previous.model.parts[0]
        if isinstance(module, DistributedDataParallel):
            module = module.module
        if self.world_size > 1:
            module = apply_ddp(module, self.device)
        coordinates = self.plan.mesh.coordinates(self.rank)
        wanted = self.job.step is not None and self.world_size > 1  # one process: no group
        mesh = device_mesh_for(self.plan, self.device) if wanted else None
        self.model = ParallelModel(
            parts=[module], plan=self.plan, coordinates=coordinates, device_mesh=mesh
        )
        self.optimizers, self.base_lrs = previous.optimizers, previous.base_lrs
        self.loss_of = self._loss_of()
        self._shard_batches()
        self.adapt_from(previous.adapt.state if previous.adapt is not None else None)
        self.start_step = step
        return step

    def _build_model(self) -> nn.Module:
        model = _call_user("model factory", self.job.model)
        if not isinstance(model, nn.Module):
            raise ConfigError(
                f"the job's model factory must return a torch.nn.Module, "
                f"but it returned {type(model).__name__}"
            )
        return model

    def _sample(self) -> Any:
        """One sample's inputs (batch of 1): the pipeline checks its stages on it."""
        if len(self.dataset) == 0:
            raise ConfigError("the job's dataset is empty; give it at least one sample")
        return collate([self.dataset[0]], self.job.collate)[0]

    def _microbatch(self, indices: torch.Tensor) -> Batch:
        inputs, targets = collate([self.dataset[int(i)] for i in indices], self.job.collate)
        return to_device(inputs, self.device), to_device(targets, self.device)

    def _loss_of(self) -> Callable[[nn.Module, Any, Any], torch.Tensor]:
        """A micro-batch's loss: ``loss(model(inputs), targets)``, or the job's own
        step with the run's context."""
        job = self.job
        if job.step is None:
            return lambda module, inputs, targets: job.loss(job.call(module, inputs), targets)
        ctx = step_context(self.model.device_mesh, self.plan, self.rank, self.world_size)
        return lambda module, inputs, targets: job.step(module, (inputs, targets), ctx)

    def _set_lr(self, step: int) -> float:
        if self.adapt is None:
            factor = self.job.lr_schedule.multiplier(step, self.job.steps)
        else:  # the schedule in steps of batch M0, times the rule's factor
            factor = self.job.lr_schedule.multiplier(self.adapt.schedule_step(), self.job.steps)
            factor *= self.adapt.lr_factor()
        for optimizer, bases in zip(self.optimizers, self.base_lrs, strict=True):
            for group, base in zip(optimizer.param_groups, bases, strict=True):
                group["lr"] = base * factor
        return self.base_lrs[0][0] * factor

    def train_step(self, step: int) -> StepReport:
        started = time.perf_counter()
        lr = self._set_lr(step)
        model = self.model
        adapt = self.adapt
        indices = self.batches.microbatches(step) if adapt is None else adapt.microbatches()
        # Every pipeline stage reads the batch: it runs the model's forward on it.
        micro = [self._microbatch(i) for i in indices]
        loss = model.forward_backward(micro, self.loss_of, observer=adapt)
        if self.job.grad_clip_norm is not None:
            clip_grad_norm(model.parameters(), self.job.grad_clip_norm, model.pp_group)
        for optimizer in self.optimizers:
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
        counted = torch.cat(indices).tolist() if model.counts_samples and indices else []
        samples = len(counted)
        if self.device.type == "cuda":
            # CUDA runs the step's kernels after the calls return: the step ends when they
            # do (without this, a step of micro-batches measured 0.169 s on one H100 where
            # its kernels took 0.259 s: the wait fell outside every step's time)
            torch.cuda.synchronize(self.device)
        seconds = time.perf_counter() - started
        # the adaptive batch's bookkeeping (norms collected, every K steps a choice) is
        # part of the step's time as reported, not of the time its throughput model fits
        adapt_stats = None if adapt is None else adapt.finish(step, seconds)
        seconds = time.perf_counter() - started
        return StepReport(
            step=step,
            rank=self.rank,
            loss=None if loss is None else loss.item(),
            samples=samples,
            tokens=samples * self._tokens_per_sample(micro),
            seconds=seconds,
            lr=lr,
            finished_at=time.time(),
            sample_ids=tuple(counted),
            adapt=adapt_stats,
        )

    def trace(self, trace_steps: int | None) -> None:
        """Record the last ``trace_steps`` steps of this run (from ``start_step``; see
        :func:`~unipar.runtime.tracing.trace_window`) on this rank if it is one that
        traces; off (``None``), nothing is attached and :meth:`run_step` is
        :meth:`train_step`."""
        window = trace_window(trace_steps, self.start_step, self.job.steps)
        if window is None or not traces(self.model.coordinates):
            return
        self.tracer = StepTracer(self.model.coordinates.pp, window, self.device)
        self._attachment = attach_tracer(self, self.tracer)

    def run_step(self, step: int) -> StepReport:
        """One step, traced when tracing is on and ``step`` is in its window."""
        if self.tracer is None:
            return self.train_step(step)
        return traced_step(self, step, self.tracer)

    def take_trace(self, done: int) -> TraceBatch | None:
        """This rank's records once ``done`` steps end its traced window (the tracer is
        detached then), else ``None``."""
        tracer = self.tracer
        if tracer is None or done != tracer.steps.stop:
            return None
        assert self._attachment is not None
        self._attachment.remove()
        self.tracer = self._attachment = None
        return TraceBatch(tuple(tracer.records))

    def drop_step(self) -> None:
        """Forget the gradients of a step that failed part-way (a peer was lost)."""
        for optimizer in self.optimizers:
            optimizer.zero_grad(set_to_none=True)

    @staticmethod
    def _tokens_per_sample(micro: list[Batch]) -> int:
        return tokens_per_sample(micro[0][1]) if micro else 0

    def save(self, step: int) -> Path:
        return save_checkpoint(
            self.checkpoints.directory,
            step=step,
            parts=self.model.parts,
            optimizers=self.optimizers,
            state={
                "world_size": self.world_size,
                "global_batch_size": self.job.global_batch_size,
                "plan": self.plan.to_dict(),
                "seed": self.job.seed,
                **({"adaptive": self.adapt.state.to_dict()} if self.adapt is not None else {}),
            },
            keep=self.checkpoints.keep,
        )

    def checkpoint_due(self, step: int) -> bool:
        """Whether the ``step`` steps done end on a checkpoint: every ``checkpoints.every``
        steps; with an adaptive batch, whose steps change size, every ``every`` steps of
        batch M0 in samples (after the step that reaches each multiple of every × M0)."""
        every = self.checkpoints.every
        if self.adapt is None:
            return step % every == 0
        period = every * self.adapt.state.init_batch
        return self.adapt.state.samples // period > self.adapt.samples_before // period

    def done(self, step: int) -> bool:
        """Whether the run ends before ``step``: after ``job.steps`` steps, or with an
        adaptive batch once its scale-invariant progress reaches ``job.steps`` steps of
        batch M0 (AdaScale's end of training: a budget written for M0 holds)."""
        if self.adapt is not None:
            return self.adapt.state.progress >= self.job.steps
        return step >= self.job.steps
