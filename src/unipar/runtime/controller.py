"""The controller on the driver: starts the workers, follows progress, survives failures.

A worker process that dies (killed, out of memory, node lost) is reported by Ray as
soon as its process is gone, so the controller notices within half a second, not
after a collective timeout. It then tears the whole gang down and starts a new
one from the newest checkpoint, up to ``max_failures`` times.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import ray
import torch.distributed as dist
from ray.exceptions import RayTaskError

from unipar.errors import TrainingFailedError, UniparError, UserCodeError
from unipar.job import Job
from unipar.plan import Plan
from unipar.ray_cluster.supervisor import PROCESS_LOST, Stream
from unipar.runtime.checkpoint import latest_checkpoint
from unipar.runtime.config import RunConfig
from unipar.runtime.metrics import MetricsWriter, StepAggregator, StepMetrics
from unipar.runtime.progress import ProgressBar
from unipar.runtime.tracing import TraceBatch, TraceRecord
from unipar.runtime.trainer import CheckpointPolicy, StepReport, TrainOutcome
from unipar.runtime.worker_group import WorkerGroup, WorkerInfo

_PROCESS_LOST = PROCESS_LOST
_GRACE_S = 2.0


class Callback:
    """Hooks the controller calls on the driver. Override the ones you need."""

    def on_step(self, metrics: StepMetrics, workers: Sequence[WorkerInfo]) -> None:
        """Called once the reports of every worker for a step have arrived."""

    def on_failure(self, failure: WorkerLost, attempt: int) -> None:
        """Called after a worker was lost, before the gang restarts (or gives up)."""

    def on_resize(self, event: Any) -> None:
        """Called when an elastic gang re-formed with another number of workers
        (a :class:`~unipar.runtime.elastic.formation.ResizeEvent`)."""


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
    # The traced steps' records of the gang that ran them (``trace_steps``), all ranks.
    trace: list[TraceRecord] = field(default_factory=list)


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
        predict: Callable[[Plan], float | None] | None = None,
    ) -> None:
        """``predict``: the cost model's step time of ``plan``, which each step's
        metrics carry (``None``: not predicted)."""
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
        predicted = predict(plan) if predict is not None else None
        self.aggregator = StepAggregator(plan.mesh.world_size, predicted)
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
        self.state.trace.clear()  # records of a gang that was lost are incomplete
        try:
            start_steps = self._follow(group.setup_refs(self.resume_from))
            self.bar.start_at(start_steps[0])
            return self._follow(group.train_streams())[0]
        finally:
            group.shutdown()

    def _follow(self, handles: Sequence[ray.ObjectRef | ray.ObjectRefGenerator]) -> list:
        """Every worker's result of one call, recording step reports as they stream in.
        ``ray.wait`` returns as soon as any worker has news or has failed; while reports
        flow, the controller looks once per poll interval, so a lost worker is seen
        within one."""
        calls = [_Call(rank, handle) for rank, handle in enumerate(handles)]
        interval = self.config.poll_interval_s
        while running := [call for call in calls if not call.done]:
            began = time.monotonic()
            ray.wait([call.handle for call in running], num_returns=1, timeout=interval)
            reports = []
            for call in running:
                reports += self._take(call, running)
            self._record(reports)
            if reports and not all(call.done for call in calls):
                time.sleep(max(0.0, interval - (time.monotonic() - began)))
        return [call.result for call in calls]

    def _take(self, call: _Call, running: list[_Call]) -> list[StepReport]:
        try:
            items = call.take_ready()
        except _PROCESS_LOST as error:
            raise WorkerLost(call.rank, error) from error
        except RayTaskError as error:
            # A peer's death often surfaces first as a collective error on a survivor:
            # give the dead worker's own report a moment to arrive before blaming code.
            self._raise_if_peer_lost([peer for peer in running if peer is not call])
            cause = error.cause if isinstance(error.cause, BaseException) else error
            if isinstance(cause, dist.DistError):
                raise WorkerLost(call.rank, cause) from error
            if isinstance(cause, UniparError):
                raise cause from None
            raise UserCodeError(f"worker rank {call.rank} raised:\n{error}") from None
        for batch in [item for item in items if isinstance(item, TraceBatch)]:
            self.state.trace.extend(batch.records)
        return [item for item in items if not isinstance(item, TraceBatch)]

    @staticmethod
    def _raise_if_peer_lost(peers: list[_Call]) -> None:
        if not peers:
            return
        ray.wait([peer.handle for peer in peers], num_returns=len(peers), timeout=_GRACE_S)
        for peer in peers:
            try:
                peer.take_ready()
            except _PROCESS_LOST as error:
                raise WorkerLost(peer.rank, error) from error
            except RayTaskError:
                pass

    def _record(self, reports: list[StepReport]) -> None:
        for metrics in self.aggregator.add(reports, self.state.attempt):
            self.state.history[metrics.step] = metrics
            self.metrics.write(metrics)
            self.bar.update(metrics)
            for callback in self.callbacks:
                callback.on_step(metrics, self.workers)


class _Call(Stream):
    """One worker's call in flight (see :class:`~unipar.ray_cluster.supervisor.Stream`): a plain
    result, or a stream of step reports ending with the outcome."""

    def __init__(self, rank: int, handle: ray.ObjectRef | ray.ObjectRefGenerator) -> None:
        super().__init__(None, handle)
        self.rank = rank

    def take_ready(self, *, is_last: Callable[[object], bool] | None = None) -> list[object]:
        return super().take_ready(is_last=is_last or _is_outcome)


def _is_outcome(item: object) -> bool:
    return not isinstance(item, (StepReport, TraceBatch))
