"""``fit``: train a :class:`~unipar.job.Job` on Ray workers."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from unipar.errors import UniparError, UnsupportedPlanError
from unipar.job import Job
from unipar.plan import GradSync, Plan, Strategy
from unipar.plan.for_job import plan_job
from unipar.plan.resize import resize_plan, sizes_that_work
from unipar.ray_cluster.live import live_cluster_spec
from unipar.ray_cluster.session import ray_session
from unipar.runtime.callbacks import Callback
from unipar.runtime.checkpoint import ensure_writable
from unipar.runtime.config import RunConfig
from unipar.runtime.elastic.controller import Controller
from unipar.runtime.elastic.early_start import EarlyStart
from unipar.runtime.elastic.gang_workers import check_cluster_resources, unused_gpus_note
from unipar.runtime.learn import PredictionCheck, RunLearner, summary_lines
from unipar.runtime.metrics import MetricsWriter, StepMetrics
from unipar.runtime.preflight import Preflight, first_plan_taken, preflight
from unipar.runtime.progress import format_summary
from unipar.runtime.run_trace import write_run_trace
from unipar.runtime.servers.fit import run_on_servers
from unipar.viz.trace import TraceOutputs


@dataclass(frozen=True)
class FitResult:
    history: tuple[StepMetrics, ...]
    final_checkpoint: Path | None
    run_dir: Path
    metrics_path: Path
    checkpoint_dir: Path
    failures: int
    wall_time_s: float
    plan: Plan
    explanation: str | None = None  # the planner's, when it chose the plan
    resizes: tuple[Any, ...] = ()  # the elastic gang's ResizeEvents, in order
    trace: TraceOutputs | None = None  # with ``trace_steps``: trace.json, timeline.png
    # each formation's predicted step time against its measured one (one per size)
    predictions: tuple[PredictionCheck, ...] = ()

    @property
    def losses(self) -> list[float]:
        return [m.loss for m in self.history]

    @property
    def tokens_per_s(self) -> float:
        seconds = sum(m.step_time_s for m in self.history)
        return sum(m.tokens for m in self.history) / seconds if seconds else 0.0

    def summary(self) -> str:
        return format_summary(
            first_loss=self.history[0].loss if self.history else float("nan"),
            last_loss=self.history[-1].loss if self.history else float("nan"),
            steps=len(self.history),
            tokens_per_s=self.tokens_per_s,
            wall_time_s=self.wall_time_s,
            failures=self.failures,
            checkpoint=str(self.final_checkpoint),
            metrics_path=str(self.metrics_path),
            resizes=[str(event) for event in self.resizes],
            trace=self.trace.describe() if self.trace is not None else None,
            predictions=summary_lines(self.predictions),
        )


def fit(
    job: Job,
    config: RunConfig | None = None,
    *,
    callbacks: Sequence[Callback] = (),
    size_target: Callable[[], int | None] | None = None,
    **settings: Any,
) -> FitResult:
    """Train ``job`` on Ray worker processes and return its history.

    ``config``: the run's settings (:class:`~unipar.runtime.config.RunConfig`: workers,
    plan, checkpoints, recovery, ...; default: its defaults); ``settings``: any of its
    fields by name, over ``config`` (``fit(job, workers=4, plan="auto")``).

    ``plan``: a :class:`Plan`; or a :class:`Strategy` (``"auto"``, ``"ddp"``, ``"fsdp"``,
    ``"tp"``, ``"pp"``) for the planner to complete on the connected cluster, its
    explanation printed before training; ``None``: data parallel over ``workers``.

    ``workers``: a number, or a range ``(least, most)``: the run starts on as many as
    the cluster has room for, shrinks when workers are lost or their node drains, and
    grows when room comes back (see :mod:`unipar.runtime.elastic`); a fixed number
    recovers live too, with a replacement worker. ``elastic=False``: the old restart
    of the whole gang from the newest disk checkpoint.

    ``trace_steps``: record the last N steps on each pipeline rank (see
    :mod:`unipar.runtime.tracing`) and write ``RUN_DIR/trace.json``, ``timeline.png``
    (measured under the cost model's prediction) and the measured vs predicted table,
    also in :meth:`FitResult.summary`. Off (``None``), nothing is timed.

    ``callbacks``: :class:`~unipar.runtime.callbacks.Callback` objects told of each
    step, failure and resize. ``size_target``: an outside bound on an elastic run's size,
    asked at every poll (0.5 s) (see :mod:`unipar.runtime.elastic.size_target`; the
    shared cluster's scheduler sets it).

    Joins the Ray instance of this process if there is one, else ``address``, else
    starts an embedded local cluster. Every input is checked (:func:`preflight`) before
    anything is started or written: a bad one raises
    :class:`~unipar.errors.UniparError`.
    """
    config = (RunConfig() if config is None else config).replace(**settings)
    return run(preflight(job, config, callbacks=callbacks, size_target=size_target))


def run(pre: Preflight, early: EarlyStart | None = None) -> FitResult:
    """Train the run ``pre`` describes (see :func:`fit`); ``early``: its workers asked
    for before the job was loaded (killed if the run takes none of them)."""
    try:
        return _run(pre, early)
    finally:
        if early is not None:
            early.cancel()


def _run(pre: Preflight, early: EarlyStart | None) -> FitResult:
    job, config = pre.job, pre.config
    run_dir = config.run_dir
    created = _missing_directories(config.checkpoints, run_dir)
    metrics = MetricsWriter(run_dir / "metrics.jsonl")
    started = time.perf_counter()
    plan, strategy, explanation = pre.plan, pre.strategy, None
    try:
        with ray_session(config.address):
            check_cluster_resources(config)
            note = unused_gpus_note(config)
            if note is not None:
                print(note, flush=True)
            ensure_writable(config.checkpoints)
            servers = strategy is not None and pre.servers_usable()
            if strategy is not None and (not config.elastic or servers):
                if early is not None:  # their imports done before the planner may time
                    early.settle()  # this machine's CPU
                planned, said = _plan_on_live_cluster(pre, config, strategy, servers=servers)
                if not config.elastic or planned.grad_sync is GradSync.PARAMETER_SERVER:
                    plan, explanation, strategy = planned, said, None
                    print(explanation, flush=True)
            if isinstance(plan, Plan) and plan.grad_sync is GradSync.PARAMETER_SERVER:
                if early is not None:  # the servers' run starts processes of its own
                    early.cancel()
                try:
                    served = run_on_servers(job, plan, config, metrics)
                finally:
                    metrics.close()
                return FitResult(
                    history=served.history,
                    final_checkpoint=served.model_path,
                    run_dir=run_dir,
                    metrics_path=metrics.path,
                    checkpoint_dir=config.checkpoints,
                    failures=0,
                    wall_time_s=time.perf_counter() - started,
                    plan=plan,
                    explanation=explanation,
                )
            learner = RunLearner(pre)
            plan_for = _PlanForSize(pre, plan if strategy is None else strategy)
            controller = Controller(
                job,
                config,
                plan_for=plan_for,
                resume_from=pre.resume_from,
                metrics=metrics,
                callbacks=(*pre.callbacks, learner),
                size_target=pre.size_target,
                predict=learner.predict,
                early=early.actors if early is not None else (),
            )
            try:
                outcome = controller.run()
            finally:
                metrics.close()
            plan = controller.plan or plan
            explanation = plan_for.explanation or explanation
            predictions = learner.finish(controller.state.trace)
            trace = None
            if config.trace_steps is not None and controller.state.trace:
                assert isinstance(plan, Plan)
                trace = write_run_trace(
                    lambda: pre.facts.profile,
                    plan,
                    config,
                    controller.state.trace,
                    run_dir,
                    predicted_on=learner.predicted_on,
                )
    except BaseException:
        _remove_if_empty(created)  # a failed start leaves no empty run directory behind
        raise
    assert isinstance(plan, Plan)
    history = tuple(controller.state.history[s] for s in sorted(controller.state.history))
    return FitResult(
        history=history,
        final_checkpoint=outcome.final_checkpoint,
        run_dir=run_dir,
        metrics_path=metrics.path,
        checkpoint_dir=config.checkpoints,
        failures=controller.state.failures,
        wall_time_s=time.perf_counter() - started,
        plan=plan,
        explanation=explanation,
        resizes=tuple(controller.resizes),
        trace=trace,
        predictions=predictions,
    )


class _PlanForSize:
    """The plan for each size the gang takes (one, unless elastic): the planner's choice
    on the live cluster for a strategy, else the given plan re-derived for the size."""

    def __init__(self, pre: Preflight, plan: Plan | Strategy) -> None:
        self.pre, self.config, self.plan = pre, pre.config, plan
        self.explanation: str | None = None
        self._plans: dict[int, Plan] = {}
        self._refused: dict[int, UniparError] = {}  # sizes with no plan, asked once

    def __call__(self, workers: int) -> Plan:
        if workers in self._refused:
            raise self._refused[workers].with_traceback(None)
        if workers not in self._plans:
            try:
                self._plans[workers] = self._derive(workers)
            except UniparError as error:
                self._refused[workers] = error
                raise
        return self._plans[workers]

    def _derive(self, workers: int) -> Plan:
        if isinstance(self.plan, Strategy):
            sized = replace(self.config, workers=workers, min_workers=None)
            plan, explanation = _plan_on_live_cluster(self.pre, sized, self.plan, servers=False)
            if self.explanation is None:
                print(explanation, flush=True)
            self.explanation = explanation
            return plan
        if workers == self.plan.mesh.world_size:
            return self.plan
        resized = resize_plan(self.plan, workers)
        if resized is None:
            works = sizes_that_work(self.plan, 1, max(workers, self.config.workers))
            raise UnsupportedPlanError(
                f"the plan cannot be resharded to {workers} workers; sizes that work: "
                f"{', '.join(map(str, works)) or 'none'}"
            )
        return resized


def _missing_directories(*paths: Path) -> list[Path]:
    """The directories among ``paths`` and their parents that do not exist yet."""
    missing: set[Path] = set()
    for path in paths:
        for directory in (path, *path.parents):
            if directory.exists():
                break
            missing.add(directory)
    return sorted(missing, key=lambda p: len(p.parts), reverse=True)


def _remove_if_empty(directories: list[Path]) -> None:
    """Remove the (deepest first) ``directories`` this run created and left empty."""
    for directory in directories:
        if directory.is_dir() and not any(directory.iterdir()):
            directory.rmdir()


def _plan_on_live_cluster(
    pre: Preflight, config: RunConfig, strategy: Strategy, *, servers: bool
) -> tuple[Plan, str]:
    """The planner's choice for the job on the connected cluster (of ``config``'s size),
    and its explanation; ``servers``: parameter servers may be chosen for the gradient
    exchange. The job's facts are the preflight's: no second build of the model."""
    cluster = live_cluster_spec(
        config.workers,
        cpus_per_worker=config.cpus_per_worker,
        gpus_per_worker=config.gpus_per_worker,
    )
    report = plan_job(pre.facts, cluster, strategy, consider_servers=servers)
    explanation = report.explain()
    ranked = dict.fromkeys([report.best.plan, *(c.plan for c in report.result.ranked)])
    plan, refusals = first_plan_taken(pre, list(ranked))
    if refusals:
        explanation += "\n\nthe model cannot take " + "; ".join(refusals)
        explanation += f"\nrunning the next ranked plan: {plan.mesh}"
    return plan, explanation
