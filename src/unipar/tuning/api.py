"""``unipar.tune``: unipar runs as the trials of a Ray Tune experiment.

Everything is checked before any trial starts: the space, the metric (one of the
numbers each trial reports), the searcher/scheduler pairing, a first job built from the
space, and that one trial's gang fits the cluster.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

from ray import tune as ray_tune
from ray.tune.logger import TBXLoggerCallback
from ray.tune.search import ConcurrencyLimiter
from ray.tune.stopper import CombinedStopper, FunctionStopper

from unipar.errors import ConfigError
from unipar.job import Job
from unipar.job_file import user_code_error
from unipar.ray_cluster.session import ray_session, require_resources
from unipar.runtime.config import RunConfig
from unipar.runtime.preflight import preflight
from unipar.tuning.choices import (
    DEFAULT_REDUCTION_FACTOR,
    SchedulerKind,
    SearcherKind,
    build_scheduler,
    build_searcher,
    parse_kind,
)
from unipar.tuning.optuna_driver import (
    OptunaDriver,
    OptunaPruning,
    OptunaSearcher,
    optuna_distributions,
)
from unipar.tuning.report import (
    LiveProgress,
    TrialRow,
    best_first,
    draw_curves,
    format_table,
    require_a_value,
    write_results,
)
from unipar.tuning.space import SearchSpace, load_space
from unipar.tuning.trainable import REPORTED, MakeJob, gang_resources, run_trial
from unipar.viz.draw import require_plot_extra


@dataclass(frozen=True)
class TuneResult:
    """The experiment's outcome: trials best first, the best one's config and checkpoint."""

    metric: str
    mode: str
    rows: tuple[TrialRow, ...]
    best_config: dict[str, Any]
    best_value: float
    best_checkpoint: Path | None
    experiment_path: Path
    curves: dict[str, tuple[list[int], list[float], str]] = field(repr=False)
    curves_png: Path | None = None

    def table(self) -> str:
        return format_table(self.rows, self.metric)


def tune(
    make_job: MakeJob,
    space: Mapping[str, Any] | str | Path,
    *,
    metric: str = "loss",
    mode: str = "min",
    num_samples: int = 8,
    searcher: SearcherKind | str = SearcherKind.RANDOM,
    scheduler: SchedulerKind | str = SchedulerKind.ASHA,
    workers_per_trial: int = 1,
    plan: Any = None,
    cpus_per_worker: float = 1.0,
    gpus_per_worker: float = 0.0,
    pruner: Any = None,
    resume: bool = False,
    name: str | None = None,
    storage_path: str | Path = "unipar_runs/tune",
    max_concurrent: int | None = None,
    seed: int | None = 0,
    max_failures: int = 2,
    perturbation_interval: int | None = None,
    grace_steps: int | None = None,
    reduction_factor: int = DEFAULT_REDUCTION_FACTOR,
    progress: bool = True,
    plot: bool = True,
    address: str | None = None,
) -> TuneResult:
    """Search ``space`` with ``num_samples`` trials of ``make_job(config)``, each a unipar
    run on ``workers_per_trial`` workers reserved as one gang (each with
    ``cpus_per_worker``/``gpus_per_worker``), under ``plan`` (as :func:`unipar.fit` takes
    it: a Plan, a strategy name such as "auto" or "fsdp", or None: data parallel).

    ``searcher``: random, grid, optuna (TPE) or hyperopt; ``scheduler``: fifo, asha,
    hyperband, median, pbt or pb2. ``pruner``: any Optuna pruner (needs the optuna
    searcher). ``perturbation_interval``: steps between PBT/PB2 exploits (default a quarter
    of the job's steps). ``grace_steps``: steps every trial runs before ASHA or the median
    rule may stop it (default an eighth of the most steps a trial runs);
    ``reduction_factor``: ASHA and HyperBand keep one trial in this many at each rung
    (default 4, Ray Tune's and the ASHA paper's: rungs at an eighth and half of the
    steps). ``resume``:
    continue the experiment ``name`` under ``storage_path``
    (Tune's experiment restore; finished trials are not rerun). ``plot``: draw
    ``loss_curves.png`` (needs the ``plot`` extra, checked before any trial starts); the
    table and ``results.json`` are written first either way. ``seed``: the searcher's
    sampling (the same seed samples the same configs); ``max_concurrent``: trials at once
    (None: as many as the cluster holds)."""
    space_ = load_space(space)
    searcher_kind = parse_kind(SearcherKind, searcher, "searcher")
    scheduler_kind = parse_kind(SchedulerKind, scheduler, "scheduler")
    _check_settings(metric, mode, num_samples, workers_per_trial, pruner, searcher_kind)
    if max_concurrent is not None and max_concurrent < 1:
        raise ConfigError(
            f"max_concurrent must be at least 1 (or None: no limit), but got {max_concurrent}"
        )
    _check_pairing(searcher_kind, scheduler_kind)
    _check_rungs(grace_steps, reduction_factor)
    if searcher_kind is SearcherKind.OPTUNA:  # a space Optuna cannot sample fails now
        optuna_distributions(space_)
    if plot:
        require_plot_extra()  # the curves are drawn at the end: say so before any trial
    job = _first_job(make_job, space_)
    settings = _trial_settings(
        job, plan, workers_per_trial, cpus_per_worker, gpus_per_worker, max_failures
    )
    most_steps = _most_steps(make_job, space_, job.steps)  # a searched `steps` varies it
    if grace_steps is not None and grace_steps > most_steps:
        raise ConfigError(
            f"grace_steps ({grace_steps}) is more than the most steps a trial runs "
            f"({most_steps}), so no trial could ever be stopped; pass at most {most_steps}, "
            "or scheduler='fifo'"
        )
    name = name or f"{job.name}-tune"
    experiment = Path(storage_path).resolve() / name
    with ray_session(address):
        require_resources(
            {"CPU": cpus_per_worker, "GPU": gpus_per_worker}, workers_per_trial, "worker per trial"
        )
        trainable = ray_tune.with_resources(
            partial(run_trial, make_job=make_job, settings=settings), gang_resources(settings)
        )
        if resume:
            tuner = _restore(experiment, trainable)
        else:
            _refuse_overwrite(experiment)
            tuner = _new_tuner(
                trainable,
                space_,
                steps=most_steps,
                metric=metric,
                mode=mode,
                num_samples=num_samples,
                searcher_kind=searcher_kind,
                scheduler_kind=scheduler_kind,
                pruner=pruner,
                seed=seed,
                max_concurrent=max_concurrent,
                max_failures=max_failures,
                name=name,
                storage=experiment.parent,
                progress=progress,
                perturbation_steps=perturbation_interval or max(1, job.steps // 4),
                grace_steps=grace_steps or max(1, most_steps // 8),
                reduction_factor=reduction_factor,
            )
        grid = tuner.fit()
        return _collect(grid, metric, mode, experiment, plot)


def _check_settings(
    metric: str, mode: str, num_samples: int, workers: int, pruner: Any, searcher: SearcherKind
) -> None:
    if metric not in REPORTED:
        raise ConfigError(
            f"metric {metric!r} is never reported by a trial; trials report "
            f"{', '.join(REPORTED)}; pass one of those"
        )
    if mode not in ("min", "max"):
        raise ConfigError(f"mode must be 'min' or 'max', but got {mode!r}")
    if num_samples < 1:
        raise ConfigError(f"num_samples must be at least 1, but got {num_samples}")
    if workers < 1:
        raise ConfigError(f"workers_per_trial must be at least 1, but got {workers}")
    if pruner is not None and searcher is not SearcherKind.OPTUNA:
        raise ConfigError(
            f"an Optuna pruner needs searcher='optuna', but got searcher={searcher.value!r}"
        )


def _trial_settings(
    job: Any, plan: Any, workers: int, cpus: float, gpus: float, max_failures: int
) -> RunConfig:
    """Every trial's run settings, and what each trial's ``fit`` would refuse, refused
    once before any trial starts (the preflight of the first job)."""
    settings = RunConfig(
        workers=workers,
        plan=plan,
        cpus_per_worker=cpus,
        gpus_per_worker=gpus,
        max_failures=max_failures,
        progress=False,
    )
    preflight(job, settings)
    return settings


def _check_rungs(grace_steps: int | None, reduction_factor: int) -> None:
    if grace_steps is not None and grace_steps < 1:
        raise ConfigError(
            f"grace_steps must be at least 1 (or None: an eighth of the steps), but got "
            f"{grace_steps}"
        )
    if reduction_factor < 2:
        raise ConfigError(
            f"reduction_factor must be at least 2 (each rung keeps one trial in that many), "
            f"but got {reduction_factor}"
        )


def _check_pairing(searcher: SearcherKind, scheduler: SchedulerKind) -> None:
    """Population-based schedulers choose the configs themselves (Tune refuses a searcher)."""
    if scheduler in (SchedulerKind.PBT, SchedulerKind.PB2) and searcher not in (
        SearcherKind.RANDOM,
        SearcherKind.GRID,
    ):
        raise ConfigError(
            f"the {scheduler.value} scheduler picks and mutates configs itself, so it runs "
            f"with the random/grid searcher only, but got searcher={searcher.value!r}"
        )


def _first_job(make_job: MakeJob, space: SearchSpace) -> Any:
    """A job built from the first point of the space, so a broken factory fails now."""
    return _built(make_job, {p.name: p.ends()[0] for p in space.params})  # a range's low end


def _built(make_job: MakeJob, config: dict[str, Any]) -> Any:
    try:
        job = make_job(config)
    except Exception as error:
        raise user_code_error(error, f"make_job({config})") from None
    if not isinstance(job, Job):
        raise ConfigError(
            f"make_job(config) must return a unipar.Job, but got {type(job).__name__}"
        )
    return job


def _most_steps(make_job: MakeJob, space: SearchSpace, first_steps: int) -> int:
    """The most steps of the jobs built from the first config with one parameter at one
    of its ends: the schedulers' horizon (``max_t``) when the steps are searched."""
    first = {p.name: p.ends()[0] for p in space.params}
    configs = [{**first, p.name: end} for p in space.params for end in p.ends()[1:]]
    return max([first_steps, *(_built(make_job, c).steps for c in configs)])


def _refuse_overwrite(experiment: Path) -> None:
    if experiment.exists() and any(experiment.iterdir()):
        raise ConfigError(
            f"{experiment} already holds an experiment; pass resume=True (--resume) to "
            "continue it, or another name"
        )


def _restore(experiment: Path, trainable: Any) -> Any:
    if not ray_tune.Tuner.can_restore(str(experiment)):
        raise ConfigError(
            f"cannot resume: {experiment} holds no Tune experiment; run without resume first"
        )
    return ray_tune.Tuner.restore(
        str(experiment), trainable=trainable, resume_unfinished=True, restart_errored=True
    )


def _new_tuner(
    trainable: Any,
    space: SearchSpace,
    *,
    steps: int,
    metric: str,
    mode: str,
    num_samples: int,
    searcher_kind: SearcherKind,
    scheduler_kind: SchedulerKind,
    pruner: Any,
    seed: int | None,
    max_concurrent: int | None,
    max_failures: int,
    name: str,
    storage: Path,
    progress: bool,
    perturbation_steps: int,
    grace_steps: int,
    reduction_factor: int,
) -> Any:
    # A trial that reached its job's last step is done: no scheduler may pause it then.
    stops: list[Any] = [FunctionStopper(_at_last_step)]
    param_space = space.tune_space()
    if searcher_kind is SearcherKind.OPTUNA:
        driver = OptunaDriver(space, metric=metric, mode=mode, seed=seed, pruner=pruner)
        search_alg: Any = OptunaSearcher(driver)
        if max_concurrent is not None:
            search_alg = ConcurrencyLimiter(search_alg, max_concurrent=max_concurrent)
        stops.append(OptunaPruning(driver))
        param_space = {}
    else:
        search_alg = build_searcher(searcher_kind, space, metric, mode, seed, max_concurrent)
        if searcher_kind is SearcherKind.HYPEROPT:
            param_space = {}  # the searcher holds the space, in its own form
    scheduler = build_scheduler(
        scheduler_kind,
        space,
        max_steps=steps,
        grace_steps=grace_steps,
        reduction_factor=reduction_factor,
        perturbation_steps=perturbation_steps,
        seed=seed,
    )
    total = num_samples * (space.grid_size if param_space else 1)
    return ray_tune.Tuner(
        trainable,
        param_space=param_space,
        tune_config=ray_tune.TuneConfig(
            metric=metric,
            mode=mode,
            num_samples=num_samples,
            search_alg=search_alg,
            scheduler=scheduler,  # the searcher limits the trials at once (max_concurrent)
        ),
        run_config=ray_tune.RunConfig(
            name=name,
            storage_path=str(storage),
            stop=CombinedStopper(*stops),
            verbose=0,
            failure_config=ray_tune.FailureConfig(max_failures=max_failures),
            checkpoint_config=ray_tune.CheckpointConfig(num_to_keep=4),
            callbacks=[LiveProgress(total, metric, enabled=progress), TBXLoggerCallback()],
        ),
    )


def _at_last_step(trial_id: str, result: dict[str, Any]) -> bool:
    """The trial reached its own job's last step (each trial reports its job's steps)."""
    return result.get("step", 0) >= result.get("job_steps", math.inf)


def _collect(grid: Any, metric: str, mode: str, experiment: Path, plot: bool) -> TuneResult:
    rows, curves = [], {}
    for result in grid:
        frame = result.metrics_dataframe
        trial_id = str((result.metrics or {}).get("trial_id", Path(result.path).name))
        if frame is None or metric not in frame or frame.empty:
            curves[trial_id] = ([], [], "error")
            rows.append(TrialRow(trial_id, dict(result.config or {}), float("nan"), 0, "error"))
            continue
        last_step = int(frame["step"].iloc[-1])
        done = last_step >= int(frame["job_steps"].iloc[-1])
        status = "error" if result.error else ("done" if done else "stopped")
        curves[trial_id] = (
            frame["step"].astype(int).tolist(),
            frame[metric].astype(float).tolist(),
            status,
        )
        rows.append(
            TrialRow(
                trial_id,
                dict(result.config or {}),
                float(frame[metric].iloc[-1]),
                last_step,
                status,
            )
        )
    rows = best_first(rows, mode)
    write_results(rows, metric, experiment)  # kept whatever happens next
    require_a_value(rows, metric, experiment)
    best = grid.get_best_result(metric=metric, mode=mode, scope="last")
    png = draw_curves(curves, metric, experiment / "loss_curves.png") if plot else None
    best_row = rows[0]
    return TuneResult(
        metric=metric,
        mode=mode,
        rows=tuple(rows),
        best_config=dict(best.config or {}),
        best_value=best_row.value,
        best_checkpoint=Path(best.checkpoint.path) if best.checkpoint else None,
        experiment_path=experiment,
        curves=curves,
        curves_png=png,
    )
