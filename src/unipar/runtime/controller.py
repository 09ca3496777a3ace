"""The controller on the driver: starts the workers, follows progress, survives failures.

A worker process that dies (killed, out of memory, node lost) is reported by Ray as
soon as its process is gone, so the controller notices within one poll interval,
not after a collective timeout. It then tears the whole gang down and starts a new
one from the newest checkpoint, up to ``max_failures`` times.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import ray
import torch.distributed as dist
from ray.exceptions import (
    ActorDiedError,
    NodeDiedError,
    OutOfMemoryError,
    RayActorError,
    RayTaskError,
    WorkerCrashedError,
)

from unipar.errors import TrainingFailedError, UniparError, UserCodeError
from unipar.job import Job
from unipar.plan import Plan
from unipar.runtime.checkpoint import latest_checkpoint
from unipar.runtime.config import RunConfig
from unipar.runtime.metrics import MetricsWriter, StepAggregator, StepMetrics
from unipar.runtime.progress import ProgressBar
from unipar.runtime.trainer import CheckpointPolicy, TrainOutcome
from unipar.runtime.worker_group import WorkerGroup, WorkerInfo

_PROCESS_LOST = (ActorDiedError, RayActorError, NodeDiedError, OutOfMemoryError, WorkerCrashedError)
_GRACE_S = 2.0


class Callback:
    """Hooks the controller calls on the driver. Override the ones you need."""

    def on_step(self, metrics: StepMetrics, workers: Sequence[WorkerInfo]) -> None:
        """Called once the reports of every worker for a step have arrived."""

    def on_failure(self, failure: WorkerLost, attempt: int) -> None:
        """Called after a worker was lost, before the gang restarts (or gives up)."""


class WorkerLost(Exception):
    """A worker's process is gone; the run can restart from a checkpoint."""

    def __init__(self, rank: int, cause: BaseException) -> None:
        super().__init__(f"worker rank {rank} was lost: {type(cause).__name__}: {cause}")
        self.rank = rank
        self.cause = cause


@dataclass
class RunState:
    attempt: int = 0
    failures: int = 0
    history: dict[int, StepMetrics] = field(default_factory=dict)


class Controller:
    def __init__(
        self,
        job: Job,
        plan: Plan,
        config: RunConfig,
        *,
        resume_from: Path | None,
        metrics: MetricsWriter,
        callbacks: Sequence[Callback] = (),
    ) -> None:
        self.job, self.plan, self.config = job, plan, config
        self.resume_from = resume_from
        self.metrics = metrics
        self.callbacks = callbacks
        self.policy = CheckpointPolicy(
            directory=config.checkpoints.resolve(),
            every=config.checkpoint_interval(job.steps),
            keep=config.keep_checkpoints,
        )
        self.state = RunState()
        self.aggregator = StepAggregator(plan.mesh.world_size)
        self.bar = ProgressBar(job.steps, enabled=config.progress)

    def run(self) -> TrainOutcome:
        try:
            while True:
                try:
                    return self._attempt()
                except WorkerLost as lost:
                    self._recover(lost)
        finally:
            self.bar.close()

    def _recover(self, lost: WorkerLost) -> None:
        state = self.state
        state.failures += 1
        for callback in self.callbacks:
            callback.on_failure(lost, state.attempt)
        if state.failures > self.config.max_failures:
            raise TrainingFailedError(
                f"workers failed {state.failures} times, more than max_failures="
                f"{self.config.max_failures}; last: {lost}. Check the workers' logs, or raise "
                "max_failures"
            ) from lost.cause
        newest = latest_checkpoint(self.policy.directory)
        self.resume_from = newest or self.resume_from
        where = f"checkpoint {self.resume_from.name}" if self.resume_from else "the start"
        self.bar.note(
            f"[unipar] {lost}; restarting from {where} "
            f"(failure {state.failures} of at most {self.config.max_failures})"
        )
        state.attempt += 1
        self.aggregator.reset()

    def _attempt(self) -> TrainOutcome:
        group = WorkerGroup(self.job, self.plan, self.config, self.policy)
        self.workers = group.info
        try:
            start_steps = self._wait(group, group.setup_refs(self.resume_from), poll=False)
            self.bar.start_at(start_steps[0])
            outcomes = self._wait(group, group.train_refs(), poll=True)
            self._collect(group.drain_refs())
            return outcomes[0]
        finally:
            group.shutdown()

    def _wait(self, group: WorkerGroup, refs: list[ray.ObjectRef], *, poll: bool) -> list:
        rank_of = {ref: rank for rank, ref in enumerate(refs)}
        results: dict[int, object] = {}
        pending = list(refs)
        while pending:
            # Returns as soon as any worker finishes or fails, so a lost worker is seen
            # at once; the timeout only sets how often progress is collected.
            ready, pending = ray.wait(pending, num_returns=1, timeout=self.config.poll_interval_s)
            for ref in ready:
                results[rank_of[ref]] = self._get(ref, rank_of[ref], pending, rank_of)
            if poll and pending:
                self._collect(group.drain_refs())
        return [results[rank] for rank in range(len(refs))]

    def _get(
        self, ref: ray.ObjectRef, rank: int, pending: list[ray.ObjectRef], rank_of: dict
    ) -> object:
        try:
            return ray.get(ref)
        except _PROCESS_LOST as error:
            raise WorkerLost(rank, error) from error
        except RayTaskError as error:
            # A peer's death often surfaces first as a collective error on a survivor:
            # give the dead worker's own report a moment to arrive before blaming code.
            self._raise_if_peer_lost(pending, rank_of)
            cause = error.cause if isinstance(error.cause, BaseException) else error
            if isinstance(cause, dist.DistError):
                raise WorkerLost(rank, cause) from error
            if isinstance(cause, UniparError):
                raise cause from None
            raise UserCodeError(f"worker rank {rank} raised:\n{error}") from None

    def _raise_if_peer_lost(self, pending: list[ray.ObjectRef], rank_of: dict) -> None:
        if not pending:
            return
        ready, _ = ray.wait(pending, num_returns=len(pending), timeout=_GRACE_S)
        for ref in ready:
            try:
                ray.get(ref)
            except _PROCESS_LOST as error:
                raise WorkerLost(rank_of[ref], error) from error
            except RayTaskError:
                pass

    def _collect(self, drain_refs: list[ray.ObjectRef]) -> None:
        reports = []
        for rank, ref in enumerate(drain_refs):
            try:
                reports.extend(ray.get(ref))
            except _PROCESS_LOST as error:
                raise WorkerLost(rank, error) from error
        for metrics in self.aggregator.add(reports, self.state.attempt):
            self.state.history[metrics.step] = metrics
            self.metrics.write(metrics)
            self.bar.update(metrics)
            for callback in self.callbacks:
                callback.on_step(metrics, self.workers)
