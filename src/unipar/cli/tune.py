"""``unipar tune JOB.py --space SPACE.yaml``: the file's ``job(config)`` under Ray Tune."""

from __future__ import annotations

import argparse
import runpy
from pathlib import Path
from typing import Any

from unipar.errors import ConfigError
from unipar.job_file import check_target, user_code_error
from unipar.tuning.choices import DEFAULT_REDUCTION_FACTOR, SchedulerKind, SearcherKind


def add_tune_parser(commands: Any) -> None:
    tune = commands.add_parser("tune", help="tune a job's hyperparameters on Ray Tune")
    tune.add_argument("target", help="a .py file whose `job(config)` returns a unipar.Job")
    tune.add_argument("--space", required=True, help="YAML file of the search space")
    tune.add_argument("--samples", type=int, default=8, help="trials (per grid point)")
    tune.add_argument("--metric", default="loss")
    tune.add_argument("--mode", default="min", choices=("min", "max"))
    tune.add_argument("--searcher", default="random", choices=[k.value for k in SearcherKind])
    tune.add_argument("--scheduler", default="asha", choices=[k.value for k in SchedulerKind])
    tune.add_argument("--workers-per-trial", type=int, default=1)
    tune.add_argument("--grace-steps", type=int, default=None,
                      help="steps before ASHA or the median rule may stop a trial "
                      "(default: an eighth of the steps)")
    tune.add_argument("--reduction-factor", type=int, default=DEFAULT_REDUCTION_FACTOR,
                      help="ASHA/HyperBand keep one trial in this many at each rung")
    tune.add_argument("--seed", type=int, default=0, help="the searcher's sampling seed")
    tune.add_argument("--max-concurrent", type=int, default=None,
                      help="trials at once (default: as many as the cluster holds)")
    tune.add_argument("--name", default=None, help="experiment name (default: JOB-tune)")
    tune.add_argument("--storage", default="unipar_runs/tune", help="experiments' folder")
    tune.add_argument("--resume", action="store_true", help="continue the experiment --name")
    tune.add_argument(
        "--no-plot", action="store_true", help="skip loss_curves.png (no matplotlib needed)"
    )
    tune.add_argument("--address", default=None, help="HOST:PORT of a running Ray cluster")
    tune.set_defaults(handler=_tune)


def load_job_factory(target: str) -> Any:
    """The file's ``job``: a function of the trial's config returning a Job."""
    check_target(target)
    path = Path(target)
    try:
        factory = runpy.run_path(str(path), run_name="__unipar_job__").get("job")
    except Exception as error:
        raise user_code_error(error, f"the job file {path}") from None
    if not callable(factory):
        raise ConfigError(
            f"{path} must define `job(config)`, a function returning a unipar.Job, but it "
            f"defines {type(factory).__name__}"
        )
    return factory


def _tune(args: argparse.Namespace) -> int:
    from unipar.tuning.api import tune  # noqa: PLC0415 (heavy: Ray Tune, torch)

    result = tune(
        load_job_factory(args.target),
        Path(args.space),
        metric=args.metric,
        mode=args.mode,
        num_samples=args.samples,
        searcher=args.searcher,
        scheduler=args.scheduler,
        workers_per_trial=args.workers_per_trial,
        seed=args.seed,
        grace_steps=args.grace_steps,
        reduction_factor=args.reduction_factor,
        max_concurrent=args.max_concurrent,
        resume=args.resume,
        name=args.name,
        storage_path=args.storage,
        plot=not args.no_plot,
        address=args.address,
    )
    print(result.table())
    print(f"best: {result.best_config} ({args.metric} {result.best_value:.4f})")
    print(f"best checkpoint: {result.best_checkpoint}")
    print(f"results: {result.experiment_path / 'results.json'}")
    if result.curves_png is not None:
        print(f"loss curves: {result.curves_png}")
    print(f"TensorBoard: {result.experiment_path}")
    return 0
