"""The one preflight of a run: every check that can be made before Ray starts or a worker
is handed the job, and the job's facts, each learned once. (Joining a running cluster,
``unipar train`` connects and asks for its workers first: ``runtime/elastic/early_start``.)

``fit``, ``unipar train``, ``unipar.tune`` and the shared cluster's ``submit`` all call
:func:`preflight` and use the frozen :class:`Preflight` it returns: the job's model is
built on the meta device at most once (the planner's analysis, the embedding share,
the checks of a plan against the model's layers and of the loss all read that build)
and its dataset is opened at most once, however often the run is planned again (an
elastic run plans each size it takes).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from unipar.data.batch import Batch, rows
from unipar.errors import ConfigError, UniparError, UnsupportedPlanError
from unipar.job import Job
from unipar.plan import GradSync, Plan, Strategy
from unipar.plan.for_job import JobFacts, job_batch, job_facts
from unipar.plan.resize import require_resizable
from unipar.plan.runtime_support import check_plan_for_run
from unipar.runtime.adaptive import check_adaptive_loss
from unipar.runtime.callbacks import Callback
from unipar.runtime.checkpoint import resume_point
from unipar.runtime.config import RunConfig
from unipar.runtime.fit_inputs import check_fit_inputs, check_size_target
from unipar.runtime.parallel.model_checks import check_plan_for_model
from unipar.runtime.servers.for_job import check_worth_serving_job, server_optimizer
from unipar.runtime.tracing import traced_steps
from unipar.viz.draw import require_plot_extra


@dataclass(frozen=True)
class Preflight:
    """A run that passed every check made before Ray starts: the job, its settings (the
    run directory chosen), the plan asked for (a :class:`Plan`, or a :class:`Strategy`
    for the planner to complete on the live cluster), the checkpoint it resumes from,
    and the job's facts (:attr:`facts`, learned on first use and kept)."""

    job: Job
    config: RunConfig
    plan: Plan | Strategy
    resume_from: Path | None
    callbacks: tuple[Callback, ...] = ()
    size_target: Callable[[], int | None] | None = None

    @functools.cached_property
    def batch(self) -> Batch | None:
        """The dataset's first two samples, collated and checked (``None`` where the
        dataset factory fails on the driver: its error is left for the workers to
        report, as they run it; a batch the runtime cannot split is refused here)."""
        try:
            return job_batch(self.job)
        except UniparError:
            raise
        except Exception:
            return None

    @functools.cached_property
    def facts(self) -> JobFacts:
        """One batch of the dataset and the model's one meta-device build."""
        return job_facts(self.job, self.batch)

    @property
    def strategy(self) -> Strategy | None:
        return self.plan if isinstance(self.plan, Strategy) else None

    def model_facts(self) -> JobFacts | None:
        """:attr:`facts`, or ``None`` where the model or dataset fails on the driver
        (their errors are then left for the workers to report, as they run them)."""
        try:
            return self.facts
        except Exception:  # UniparError included
            return None

    def servers_usable(self) -> bool:
        """Whether the planner may put this run on parameter servers: a model with tables
        worth serving, a job the servers can train (:func:`server_optimizer`), and none of
        the run options their path lacks (resume, callbacks, tracing, an outside size, a
        custom step)."""
        if servers_refusal(self.config, self.callbacks, self.size_target) or self.job.step:
            return False
        try:
            server_optimizer(self.job)
        except ConfigError:
            return False
        facts = self.model_facts()
        return facts is not None and facts.serves_embeddings


def preflight(
    job: Job,
    config: RunConfig | None = None,
    *,
    callbacks: Sequence[Callback] = (),
    size_target: Callable[[], int | None] | None = None,
) -> Preflight:
    """Check ``job`` under ``config`` (default :class:`RunConfig`) before anything starts;
    a bad input raises :class:`~unipar.errors.UniparError` naming the rule, the values
    and a fix, and nothing is written or started."""
    config = RunConfig() if config is None else config
    check_fit_inputs(job, config.plan, callbacks, config.address)
    check_size_target(size_target)
    config = config.for_job(job.name)
    pre = Preflight(
        job=job,
        config=config,
        plan=Plan.data_parallel(config.workers, job.global_batch_size)
        if config.plan is None
        else config.plan,
        resume_from=None,
        callbacks=tuple(callbacks),
        size_target=size_target,
    )
    pre.batch  # noqa: B018 (checked before anything starts: a bad one is refused here)
    if job.step is not None and isinstance(pre.plan, Strategy):
        check_step_strategy(pre.plan)
    if job.adaptive is not None:
        facts = pre.model_facts()
        if facts is not None:
            check_adaptive_loss(job, facts.spec.meta_model, facts.inputs, facts.targets)
    if config.trace_steps is not None:
        traced_steps(config.trace_steps, 0, job.steps)  # not more steps than the run has
        require_plot_extra()  # it draws timeline.png at the end: say so before training
    if isinstance(pre.plan, Plan):
        _check_plan(pre, pre.plan)
    resume_from = resume_point(config.resume, config.checkpoints)  # paths as the user gave
    resolved = replace(config, run_dir=config.run_dir.resolve())
    return _with(pre, config=resolved, resume_from=resume_from)


def _with(pre: Preflight, **changes: object) -> Preflight:
    """``pre`` with ``changes``, keeping facts already learned."""
    changed = replace(pre, **changes)
    for learned in ("batch", "facts"):
        if learned in pre.__dict__:
            changed.__dict__[learned] = pre.__dict__[learned]
    return changed


def _check_plan(pre: Preflight, plan: Plan) -> None:
    """A given plan the run can take: its size, its batch, what its gradient exchange
    needs, the model's layers (built on the meta device) and the worker range."""
    job, config = pre.job, pre.config
    check_plan_for_run(plan, (config.least_workers, config.workers), job.global_batch_size)
    if plan.grad_sync is GradSync.PARAMETER_SERVER:
        server_optimizer(job)  # the job's rules for servers, before anything starts
        facts = pre.model_facts()
        if facts is not None:
            check_worth_serving_job(facts.spec.meta_model)
        refusal = servers_refusal(config, pre.callbacks, pre.size_target)
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
    if job.step is not None:
        check_step_plan(plan)
    check_model_takes_plan(pre, plan)
    if config.elastic:
        require_resizable(plan, config.least_workers, config.workers)


def check_model_takes_plan(pre: Preflight, plan: Plan) -> None:
    """Refuse, before any worker starts, a tensor or pipeline parallel plan the job's
    model cannot take (its meta-device build: no memory, no compute). A model factory
    that fails on the driver is left for the workers to report."""
    if plan.mesh.tp == 1 and plan.mesh.pp == 1:
        return
    facts = pre.model_facts()
    if facts is not None:  # pipeline stages run on the first sample, on the meta device
        sample = rows(facts.inputs, 0, 1)
        check_plan_for_model(facts.spec.meta_model, plan, sample, pre.job.call)


_STEP_REFUSAL = (
    "a custom Job.step computes the loss of a whole micro-batch on this rank's model"
)


def check_step_strategy(strategy: Strategy) -> None:
    """A custom step under a strategy that is always pipeline parallel is refused."""
    if strategy is Strategy.PP:
        raise ConfigError(
            f"{_STEP_REFUSAL}, but under pipeline parallelism the schedule owns forward and "
            "backward, stage by stage; use --strategy ddp, fsdp, tp or auto (which plans "
            "without pp for a custom step), or give the job a loss instead of a step"
        )


def check_step_plan(plan: Plan) -> None:
    """A plan a custom step cannot run under: pipeline or context parallel, parameter
    servers."""
    if plan.mesh.pp > 1:
        check_step_strategy(Strategy.PP)
    if plan.mesh.cp > 1:
        raise ConfigError(
            f"{_STEP_REFUSAL}, but context parallelism gives each rank a chunk of every "
            f"sequence (cp={plan.mesh.cp}); use a plan with cp=1"
        )
    if plan.grad_sync is GradSync.PARAMETER_SERVER:
        raise ConfigError(
            f"{_STEP_REFUSAL}, but parameter servers run their own loop of "
            "loss(model(inputs), targets); pass grad_sync='all_reduce'"
        )


def servers_refusal(
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


def first_plan_taken(pre: Preflight, ranked: Sequence[Plan]) -> tuple[Plan, list[str]]:
    """The first of the planner's ``ranked`` plans the model takes (tp must divide its
    layers' widths), and why each one before it was refused."""
    refusals = []
    for plan in ranked:
        try:
            check_model_takes_plan(pre, plan)
        except UnsupportedPlanError as error:
            refusals.append(f"{plan.mesh}: {error}")
            continue
        return plan, refusals
    raise UnsupportedPlanError(
        "the model takes none of the plans the planner ranked: " + "; ".join(refusals)
    )
