"""``fit``: train a :class:`~unipar.job.Job` on Ray workers."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from unipar import validate
from unipar.errors import ConfigError, UniparError, UnsupportedPlanError
from unipar.job import Job
from unipar.plan import GradSync, Plan, Strategy
from unipar.plan.for_job import serves_embeddings
from unipar.plan.resize import require_resizable, resize_plan, sizes_that_work
from unipar.ray_cluster.session import ray_session
from unipar.runtime.adaptive import check_adaptive_loss
from unipar.runtime.callbacks import Callback
from unipar.runtime.checkpoint import ensure_writable, resume_point
from unipar.runtime.config import RunConfig, default_run_dir
from unipar.runtime.elastic.controller import Controller, check_cluster_resources
from unipar.runtime.metrics import MetricsWriter, StepMetrics
from unipar.runtime.progress import format_summary
from unipar.runtime.run_trace import write_run_trace
from unipar.runtime.servers.fit import run_on_servers
from unipar.runtime.servers.for_job import check_worth_serving_job, server_optimizer
from unipar.runtime.tracing import traced_steps
from unipar.validate import check_fit_inputs, check_plan_for_run, check_size_target
from unipar.viz.draw import require_plot_extra
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
        )


def fit(
    job: Job,
    *,
    workers: int | tuple[int, int] = 2,
    plan: Plan | Strategy | str | None = None,
    cpus_per_worker: float = 1.0,
    gpus_per_worker: float = 0.0,
    run_dir: str | Path | None = None,
    checkpoint_dir: str | Path | None = None,
    checkpoint_every: int | None = None,
    keep_checkpoints: int = 3,
    resume: bool | str | Path = False,
    max_failures: int = 3,
    address: str | None = None,
    progress: bool = True,
    placement_timeout_s: float = 60.0,
    callbacks: Sequence[Callback] = (),
    elastic: bool = True,
    snapshot_every: int | None = None,
    trace_steps: int | None = None,
    size_target: Callable[[], int | None] | None = None,
) -> FitResult:
    """Train ``job`` on ``workers`` Ray worker processes and return its history.

    ``plan``: a :class:`Plan`; or a :class:`Strategy` (``"auto"``, ``"ddp"``, ``"fsdp"``,
    ``"tp"``, ``"pp"``) for the planner to complete on the connected cluster, its
    explanation printed before training; ``None``: data parallel over ``workers``.

    ``workers``: a number, or a range ``(least, most)``: the run starts on as many as
    the cluster has room for, shrinks when workers are lost or their node drains, and
    grows when room comes back (see :mod:`unipar.runtime.elastic.controller`); a fixed number
    recovers live too, with a replacement worker. ``elastic=False``: the old restart
    of the whole gang from the newest disk checkpoint.

    ``trace_steps``: record the last N steps on each pipeline rank (see
    :mod:`unipar.runtime.tracing`) and write ``RUN_DIR/trace.json``, ``timeline.png``
    (measured under the cost model's prediction) and the measured vs predicted table,
    also in :meth:`FitResult.summary`. Off (``None``), nothing is timed.

    ``size_target``: an outside bound on an elastic run's size, asked at every poll (0.5 s)
    (see :mod:`unipar.runtime.elastic.size_target`; the shared cluster's scheduler sets it).

    Joins the Ray instance of this process if there is one, else ``address``, else
    starts an embedded local cluster. Every input is checked (:mod:`unipar.validate`)
    before anything is started or written: a bad one raises
    :class:`~unipar.errors.UniparError`. ``placement_timeout_s``: how long to wait,
    saying so, when other jobs hold the resources this run needs.
    """
    check_fit_inputs(job, plan, callbacks, address)
    check_size_target(size_target)
    if job.adaptive is not None:
        check_adaptive_loss(job)
    least, most = validate.worker_range(workers)
    config = RunConfig(
        workers=most,
        min_workers=least,
        elastic=elastic,
        snapshot_every=snapshot_every,
        trace_steps=trace_steps,
        cpus_per_worker=cpus_per_worker,
        gpus_per_worker=gpus_per_worker,
        run_dir=default_run_dir(job.name) if run_dir is None else run_dir,
        checkpoint_dir=checkpoint_dir,
        checkpoint_every=checkpoint_every,
        keep_checkpoints=keep_checkpoints,
        resume=resume,
        max_failures=max_failures,
        progress=progress,
        placement_timeout_s=placement_timeout_s,
    )
    if config.trace_steps is not None:
        traced_steps(config.trace_steps, 0, job.steps)  # not more steps than the run has
        require_plot_extra()  # it draws timeline.png at the end: say so before training
    run_dir = config.run_dir.resolve()
    config = replace(config, run_dir=run_dir)
    strategy = None if plan is None or isinstance(plan, Plan) else Strategy.parse(plan)
    if plan is None:
        plan = Plan.data_parallel(most, job.global_batch_size)
    if isinstance(plan, Plan):
        check_plan_for_run(plan, (config.least_workers, config.workers), job.global_batch_size)
        if plan.grad_sync is GradSync.PARAMETER_SERVER:
            server_optimizer(job)  # the job's rules for servers, before anything starts
            check_worth_serving_job(job)
            refusal = _servers_run_refusal(config, callbacks, size_target)
            if refusal:
                raise ConfigError(
                    f"a parameter-server run takes no {refusal}; leave it out, or pass "
                    "grad_sync='all_reduce'"
                )
        if plan.replica_samples and job.adaptive is not None:
            raise ConfigError(
                "an adaptive batch changes every replica's share as it grows; it cannot "
                f"keep the plan's uneven replica_samples {list(plan.replica_samples)}: "
                "leave out one of them"
            )
        _check_model_takes_plan(job, plan)
        if config.elastic:
            require_resizable(plan, config.least_workers, config.workers)
    resume_from = resume_point(config.resume, config.checkpoints)
    created = _missing_directories(config.checkpoints, run_dir)
    metrics = MetricsWriter(run_dir / "metrics.jsonl")
    started = time.perf_counter()
    explanation = None
    try:
        with ray_session(address):
            check_cluster_resources(config)
            ensure_writable(config.checkpoints)
            servers = strategy is not None and servers_usable(job, config, callbacks, size_target)
            if strategy is not None and (not config.elastic or servers):
                planned, said = _plan_on_live_cluster(job, config, strategy, servers=servers)
                if not config.elastic or planned.grad_sync is GradSync.PARAMETER_SERVER:
                    plan, explanation, strategy = planned, said, None
                    print(explanation, flush=True)
            if isinstance(plan, Plan) and plan.grad_sync is GradSync.PARAMETER_SERVER:
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
            plan_for = _PlanForSize(job, config, plan if strategy is None else strategy)
            controller = Controller(
                job,
                config,
                plan_for=plan_for,
                resume_from=resume_from,
                metrics=metrics,
                callbacks=callbacks,
                size_target=size_target,
            )
            try:
                outcome = controller.run()
            finally:
                metrics.close()
            plan = controller.plan or plan
            explanation = plan_for.explanation or explanation
            trace = None
            if config.trace_steps is not None and controller.state.trace:
                trace = write_run_trace(job, plan, config, controller.state.trace, run_dir)
    except BaseException:
        _remove_if_empty(created)  # a failed start leaves no empty run directory behind
        raise
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
    )


class _PlanForSize:
    """The plan for each size the gang takes (one, unless elastic): the planner's choice
    on the live cluster for a strategy, else the given plan re-derived for the size."""

    def __init__(self, job: Job, config: RunConfig, plan: Plan | Strategy) -> None:
        self.job, self.config, self.plan = job, config, plan
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
            plan, explanation = _plan_on_live_cluster(self.job, sized, self.plan, servers=False)
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


def servers_usable(
    job: Job,
    config: RunConfig,
    callbacks: Sequence[Callback],
    size_target: Callable[[], int | None] | None,
) -> bool:
    """Whether the planner may put this run on parameter servers: a model with tables
    worth serving, a job the servers can train (:func:`server_optimizer`), and none of
    the run options their path lacks (resume, callbacks, tracing, an outside size)."""
    if _servers_run_refusal(config, callbacks, size_target):
        return False
    try:
        server_optimizer(job)
        return serves_embeddings(job)
    except ConfigError:
        return False
    except Exception:  # a model or dataset that fails here is left to the planner/workers
        return False


def _servers_run_refusal(
    config: RunConfig,
    callbacks: Sequence[Callback],
    size_target: Callable[[], int | None] | None,
) -> str:
    """The run option the parameter-server path lacks, if any ('' when none)."""
    if config.resume:
        return f"resume (got {config.resume!r}: its servers restore their own snapshots)"
    if callbacks:
        return f"callbacks (got {len(callbacks)})"
    if config.trace_steps is not None:
        return f"trace_steps (got {config.trace_steps})"
    return "size_target (an elastic bound)" if size_target else ""


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


def _check_model_takes_plan(job: Job, plan: Plan) -> None:
    """Refuse, before any worker starts, a tensor or pipeline parallel plan the job's
    model cannot take (built on the meta device: no memory, no compute). A model
    factory that fails here is left for the workers to report."""
    if plan.mesh.tp == 1 and plan.mesh.pp == 1:
        return
    import torch

    from unipar.analysis.profile import SkipInPlaceOnMeta
    from unipar.runtime.parallel.parallelize import check_plan_for_model

    try:
        with torch.device("meta"), SkipInPlaceOnMeta():
            model = job.model()
    except Exception:
        return
    check_plan_for_model(model, plan)


def _plan_on_live_cluster(
    job: Job, config: RunConfig, strategy: Strategy, *, servers: bool
) -> tuple[Plan, str]:
    """The planner's choice for ``job`` on the connected cluster, and its explanation;
    ``servers``: parameter servers may be chosen for the gradient exchange."""
    from unipar.plan.for_job import plan_job
    from unipar.ray_cluster.live import live_cluster_spec

    cluster = live_cluster_spec(
        config.workers,
        cpus_per_worker=config.cpus_per_worker,
        gpus_per_worker=config.gpus_per_worker,
    )
    report = plan_job(job, cluster, strategy, consider_servers=servers)
    explanation = report.explain()
    ranked = dict.fromkeys([report.best.plan, *(c.plan for c in report.result.ranked)])
    refusals = []
    for plan in ranked:  # the first the model takes (tp must divide its layers' widths)
        try:
            _check_model_takes_plan(job, plan)
        except UnsupportedPlanError as error:
            refusals.append(f"{plan.mesh}: {error}")
            continue
        if refusals:
            explanation += "\n\nthe model cannot take " + "; ".join(refusals)
            explanation += f"\nrunning the next ranked plan: {plan.mesh}"
        return plan, explanation
    raise UnsupportedPlanError(
        "the model takes none of the plans the planner ranked: " + "; ".join(refusals)
    )
