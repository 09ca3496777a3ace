"""``fit``: train a :class:`~unipar.job.Job` on Ray workers."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from unipar.job import Job
from unipar.plan import Plan, Strategy
from unipar.ray_session import ray_session
from unipar.runtime.checkpoint import ensure_writable, resume_point
from unipar.runtime.config import RunConfig, default_run_dir
from unipar.runtime.controller import Callback, Controller
from unipar.runtime.metrics import MetricsWriter, StepMetrics
from unipar.runtime.progress import format_summary
from unipar.runtime.worker_group import check_cluster_resources
from unipar.validate import check_fit_inputs, check_plan_for_run


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
        )


def fit(
    job: Job,
    *,
    workers: int = 2,
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
) -> FitResult:
    """Train ``job`` on ``workers`` Ray worker processes and return its history.

    ``plan``: a :class:`Plan`; or a :class:`Strategy` (``"auto"``, ``"ddp"``, ``"fsdp"``,
    ``"tp"``, ``"pp"``) for the planner to complete on the connected cluster, its
    explanation printed before training; ``None``: data parallel over ``workers``.

    Joins the Ray instance of this process if there is one, else ``address``, else
    starts an embedded local cluster. Every input is checked (:mod:`unipar.validate`)
    before anything is started or written: a bad one raises
    :class:`~unipar.errors.UniparError`. ``placement_timeout_s``: how long to wait,
    saying so, when other jobs hold the resources this run needs.
    """
    check_fit_inputs(job, plan, callbacks, address)
    config = RunConfig(
        workers=workers,
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
    run_dir = config.run_dir.resolve()
    config = dataclasses.replace(config, run_dir=run_dir)
    strategy = None if plan is None or isinstance(plan, Plan) else Strategy.parse(plan)
    if plan is None:
        plan = Plan.data_parallel(workers, job.global_batch_size)
    if isinstance(plan, Plan):
        check_plan_for_run(plan, config.workers, job.global_batch_size)
        _check_model_takes_plan(job, plan)
    resume_from = resume_point(config.resume, config.checkpoints)
    metrics = MetricsWriter(run_dir / "metrics.jsonl")
    started = time.perf_counter()
    explanation = None
    with ray_session(address):
        check_cluster_resources(config)
        ensure_writable(config.checkpoints)
        if strategy is not None:
            plan, explanation = _plan_on_live_cluster(job, config, strategy)
            print(explanation, flush=True)
        controller = Controller(
            job, plan, config, resume_from=resume_from, metrics=metrics, callbacks=callbacks
        )
        try:
            outcome = controller.run()
        finally:
            metrics.close()
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
    )


def _check_model_takes_plan(job: Job, plan: Plan) -> None:
    """Refuse, before any worker starts, a tensor or pipeline parallel plan the job's
    model cannot take (built on the meta device: no memory, no compute). A model
    factory that fails here is left for the workers to report."""
    if plan.mesh.tp == 1 and plan.mesh.pp == 1:
        return
    import torch

    from unipar.analysis.profile import SkipInPlaceOnMeta
    from unipar.runtime.parallelize import check_plan_for_model

    try:
        with torch.device("meta"), SkipInPlaceOnMeta():
            model = job.model()
    except Exception:
        return
    check_plan_for_model(model, plan)


def _plan_on_live_cluster(job: Job, config: RunConfig, strategy: Strategy) -> tuple[Plan, str]:
    """The planner's choice for ``job`` on the connected cluster, and its explanation."""
    from unipar.cluster.live import live_cluster_spec
    from unipar.plan.for_job import plan_job

    cluster = live_cluster_spec(
        config.workers,
        cpus_per_worker=config.cpus_per_worker,
        gpus_per_worker=config.gpus_per_worker,
    )
    report = plan_job(job, cluster, strategy)
    _check_model_takes_plan(job, report.best.plan)
    return report.best.plan, report.explain()
