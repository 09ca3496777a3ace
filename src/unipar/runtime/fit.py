"""``fit``: train a :class:`~unipar.job.Job` on Ray workers."""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from unipar.errors import CheckpointError, ConfigError
from unipar.job import Job
from unipar.plan import Plan, Strategy
from unipar.ray_session import ray_session
from unipar.runtime.checkpoint import ensure_writable, list_checkpoints, resolve_resume_path
from unipar.runtime.config import RunConfig, default_run_dir
from unipar.runtime.controller import Callback, Controller
from unipar.runtime.metrics import MetricsWriter, StepMetrics
from unipar.runtime.progress import format_summary
from unipar.runtime.worker_group import check_cluster_resources


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
    callbacks: Sequence[Callback] = (),
) -> FitResult:
    """Train ``job`` on ``workers`` Ray worker processes and return its history.

    ``plan``: a :class:`Plan`; or a :class:`Strategy` (``"auto"``, ``"ddp"``, ``"fsdp"``,
    ``"tp"``, ``"pp"``) for the planner to complete on the connected cluster, its
    explanation printed before training; ``None``: data parallel over ``workers``.

    Joins the Ray instance of this process if there is one, else ``address``, else
    starts an embedded local cluster. Every input is checked before anything is
    started or written: a bad one raises :class:`~unipar.errors.UniparError`.
    """
    run_dir = (Path(run_dir) if run_dir else default_run_dir(job.name)).resolve()
    config = RunConfig(
        workers=workers,
        cpus_per_worker=cpus_per_worker,
        gpus_per_worker=gpus_per_worker,
        run_dir=run_dir,
        checkpoint_dir=Path(checkpoint_dir) if checkpoint_dir else None,
        checkpoint_every=checkpoint_every,
        keep_checkpoints=keep_checkpoints,
        resume=resume if isinstance(resume, bool) else Path(resume),
        max_failures=max_failures,
        address=address,
        progress=progress,
    )
    strategy = None if plan is None or isinstance(plan, Plan) else Strategy.parse(plan)
    if plan is None:
        plan = Plan.data_parallel(workers, job.global_batch_size)
    if isinstance(plan, Plan):
        _check_plan(job, plan)
        _check_model_takes_plan(job, plan)
    resume_from = _resume_point(config)
    created = _missing_directories(config.checkpoints, run_dir)
    ensure_writable(config.checkpoints)
    metrics = MetricsWriter(run_dir / "metrics.jsonl")
    started = time.perf_counter()
    explanation = None
    try:
        with ray_session(address):
            check_cluster_resources(config)
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
    )


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


def _check_plan(job: Job, plan: Plan) -> None:
    if plan.global_batch_size != job.global_batch_size:
        raise ConfigError(
            f"the plan's global batch (microbatch_size={plan.microbatch_size} x "
            f"num_microbatches={plan.num_microbatches} x data replicas="
            f"{plan.mesh.data_replicas} = {plan.global_batch_size}) must equal the job's "
            f"global_batch_size={job.global_batch_size}; adjust one of them"
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


def _resume_point(config: RunConfig) -> Path | None:
    """The checkpoint to start from, checked now; refuses to overwrite old checkpoints."""
    if config.resume is True:
        return resolve_resume_path(config.checkpoints).path
    if config.resume:
        return resolve_resume_path(config.resume).path
    existing = list_checkpoints(config.checkpoints)
    if existing:
        raise CheckpointError(
            f"checkpoint directory {config.checkpoints} already holds checkpoints (newest: "
            f"{existing[-1].name}); pass resume=True (--resume) to continue that run, or "
            "choose another directory so they are not overwritten"
        )
    return None
