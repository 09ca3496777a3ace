"""``unipar train``: train a job (a built-in recipe or a file defining `job`) on Ray workers."""

from __future__ import annotations

import argparse
import dataclasses
from typing import TYPE_CHECKING, Any

from unipar import checks
from unipar.adapt import AdaptiveBatch
from unipar.errors import ConfigError
from unipar.job_file import check_target, load_job
from unipar.ray_cluster.address import check_cluster, joins_a_cluster
from unipar.runtime.config import RunConfig, cli_fields

if TYPE_CHECKING:
    from unipar.job import Job
    from unipar.runtime.elastic.early_start import EarlyStart
    from unipar.runtime.preflight import Preflight

DEFAULT_MAX_BATCH_FACTOR = 8


def _train(args: argparse.Namespace) -> int:
    import ray  # noqa: PLC0415 (heavy: Ray)

    from unipar.ray_cluster.session import start_ray  # noqa: PLC0415 (heavy: Ray)

    config = _check_train_args(args)
    if not joins_a_cluster(config.address):
        pre = _load_and_check(args, config)  # bad input is answered before Ray starts
        start_ray(config.address, checked=True)
        try:
            return _run_and_report(pre)
        finally:
            ray.shutdown()
    # a cluster that is there already: its workers start while the job loads
    from unipar.runtime.elastic.early_start import (  # noqa: PLC0415 (heavy: torch, Ray)
        EarlyStart,
    )

    start_ray(config.address, checked=True)
    early = None
    try:
        early = EarlyStart(config)
        return _run_and_report(_load_and_check(args, config), early)
    finally:
        if early is not None:
            early.cancel()
        ray.shutdown()


def _check_train_args(args: argparse.Namespace) -> RunConfig:
    """What of ``unipar train`` can be checked before the job is loaded or Ray starts:
    the flags (as :class:`RunConfig`), and the cluster's address, probed."""
    check_target(args.target)
    if args.steps is not None:
        checks.integer("--steps", args.steps, minimum=1)
    if args.max_batch is not None:
        checks.integer("--max-batch", args.max_batch, minimum=1)
        if not args.adaptive_batch:
            raise ConfigError(
                f"--max-batch bounds the adaptive batch, but got --max-batch {args.max_batch} "
                "without --adaptive-batch; add --adaptive-batch or leave --max-batch out"
            )
    config = run_config(run_options(args))
    if joins_a_cluster(config.address):  # within seconds, before anything
        config = dataclasses.replace(config, address=check_cluster(config.address))
    return config


def _load_and_check(args: argparse.Namespace, config: RunConfig) -> Preflight:
    """The job file executed once, the command line's changes to the job, the preflight."""
    from unipar.runtime.preflight import preflight  # noqa: PLC0415 (heavy: torch)

    job = load_job(args.target)
    if args.steps is not None:
        job = dataclasses.replace(job, steps=args.steps)
    if args.adaptive_batch:
        job = with_adaptive_batch(job, args.max_batch)
    return preflight(job, config)


def with_adaptive_batch(job: Job, max_batch: int | None) -> Job:
    """``job`` adapting its batch up to ``max_batch`` (None: 8 × its global batch); the
    job's rules (a bound at least M0, a rule for its optimizer) are checked as it is
    made, its loss by the preflight."""
    bound = max_batch if max_batch is not None else DEFAULT_MAX_BATCH_FACTOR * job.global_batch_size
    return dataclasses.replace(job, adaptive=AdaptiveBatch(max_global_batch=bound))


def run_options(args: argparse.Namespace) -> dict[str, Any]:
    """The :class:`RunConfig` fields given on the command line (flags left out keep
    ``fit``'s defaults)."""
    return {f.name: getattr(args, f.name) for f in cli_fields() if hasattr(args, f.name)}


def run_config(options: dict[str, Any]) -> RunConfig:
    """Every flag's value checked by the rules of :class:`RunConfig`; errors name the
    flag rather than the field."""
    try:
        return RunConfig(**options)
    except ConfigError as error:
        message = str(error)
        for field in cli_fields():
            if message.startswith(field.name + " "):
                flag = field.metadata.get("flag", "--" + field.name.replace("_", "-"))
                message = flag + message[len(field.name) :]
        raise type(error)(message) from None


def _run_and_report(pre: Preflight, early: EarlyStart | None = None) -> int:
    from unipar.runtime.run import run  # noqa: PLC0415 (heavy: torch, Ray)

    least, most = pre.config.least_workers, pre.config.workers
    workers = f"{most}" if least == most else f"{least}..{most}"
    plural = "" if workers == "1" else "s"
    print(
        f"unipar: training {pre.job.name} for {pre.job.steps} steps on {workers} worker{plural}",
        flush=True,
    )
    result = run(pre, early)  # joins the Ray instance started above
    print(result.summary())
    return 0


def add_run_options(parser: argparse.ArgumentParser) -> None:
    """One flag per :class:`RunConfig` field that carries help text (its metadata)."""
    for field in cli_fields():
        options = dict(field.metadata)
        flag = options.pop("flag", "--" + field.name.replace("_", "-"))
        options.pop("submit")
        default = options.pop("cli_default", argparse.SUPPRESS)
        if not isinstance(field.default, bool) and "default:" not in options["help"]:
            options["help"] += f" (default: {field.default})"
        parser.add_argument(flag, dest=field.name, default=default, **options)


def add_train_parser(commands: argparse._SubParsersAction) -> None:
    train = commands.add_parser("train", help="train a job on Ray workers")
    train.add_argument(
        "target",
        nargs="?",
        default="gpt-stdlib",
        help="built-in recipe name or a .py file defining `job`",
    )
    train.add_argument("--steps", type=int, default=None, help="override the job's steps")
    train.add_argument(
        "--adaptive-batch",
        action="store_true",
        help="adapt the global batch (and learning rate) to the gradient noise for the best "
        "goodput, from the job's global_batch_size up to --max-batch",
    )
    train.add_argument(
        "--max-batch",
        type=int,
        default=None,
        help="with --adaptive-batch: the largest global batch "
        f"(default: {DEFAULT_MAX_BATCH_FACTOR} x the job's global_batch_size)",
    )
    add_run_options(train)
    train.set_defaults(handler=_train)
