"""``unipar train``: train a job (a built-in recipe or a file defining `job`) on Ray workers."""

from __future__ import annotations

import argparse
import dataclasses
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING, Any

from unipar import checks
from unipar.adapt import AdaptiveBatch
from unipar.errors import ConfigError
from unipar.job_file import check_target, load_job
from unipar.plan import Plan, Strategy
from unipar.plan.runtime_support import check_plan_for_run
from unipar.ray_cluster.address import check_address, check_cluster
from unipar.runtime.config import RunConfig, cli_fields
from unipar.runtime.tracing import traced_steps

if TYPE_CHECKING:
    from unipar.job import Job


def _train(args: argparse.Namespace) -> int:
    import ray  # noqa: PLC0415 (heavy: Ray)

    from unipar.ray_cluster.session import start_ray  # noqa: PLC0415 (heavy: Ray)

    plan, options, config, address = _check_train_args(args)
    if args.adaptive_batch:  # the bound and the loss are checked against the job first
        adaptive_job = with_adaptive_batch(load_job(args.target), args.max_batch)
    # Ray's start is partly waiting on its own processes: load the job (importing torch)
    # meanwhile. Ray stays on the main thread: its processes die with the thread that
    # started them.
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="unipar-load-job") as pool:
        loading = pool.submit(load_job, args.target)
        try:
            start_ray(address, checked=True)
            job = adaptive_job if args.adaptive_batch else loading.result()
        except BaseException:
            ray.shutdown()
            raise
    try:
        return _fit_and_report(job, plan, args, options, config)
    finally:
        ray.shutdown()


def _check_train_args(
    args: argparse.Namespace,
) -> tuple[Plan | Strategy, dict[str, Any], RunConfig, str | None]:
    """Every input of ``unipar train`` that can be checked before Ray starts: the plan,
    the run options (and their config), and the cluster's address, probed."""
    check_target(args.target)
    check_address(args.address)
    if args.steps is not None:
        checks.integer("--steps", args.steps, minimum=1)
    if args.max_batch is not None:
        checks.integer("--max-batch", args.max_batch, minimum=1)
        if not args.adaptive_batch:
            raise ConfigError(
                f"--max-batch bounds the adaptive batch, but got --max-batch {args.max_batch} "
                "without --adaptive-batch; add --adaptive-batch or leave --max-batch out"
            )
    plan = _strategy(args.strategy)
    options = run_options(args)
    config = _run_config(options)
    if config.trace_steps is not None and args.steps is not None:
        traced_steps(config.trace_steps, 0, args.steps)
    if isinstance(plan, Plan):
        check_plan_for_run(plan, (config.least_workers, config.workers))
    if config.resume or "run_dir" in options or "checkpoint_dir" in options:
        from unipar.runtime.checkpoint import resume_point  # noqa: PLC0415 (heavy: torch)

        resume_point(config.resume, config.checkpoints)
    address = args.address
    if address and address != "local":
        address = check_cluster(address)  # within seconds, before anything starts
    return plan, options, config, address


DEFAULT_MAX_BATCH_FACTOR = 8


def with_adaptive_batch(job: Job, max_batch: int | None) -> Job:
    """``job`` adapting its batch up to ``max_batch`` (None: 8 × its global batch); the
    job's rules (a bound at least M0, a rule for its optimizer) and a mean loss checked."""
    from unipar.runtime.adaptive import check_adaptive_loss  # noqa: PLC0415 (heavy: torch)

    bound = max_batch if max_batch is not None else DEFAULT_MAX_BATCH_FACTOR * job.global_batch_size
    job = dataclasses.replace(job, adaptive=AdaptiveBatch(max_global_batch=bound))
    check_adaptive_loss(job)
    return job


def run_options(args: argparse.Namespace) -> dict[str, Any]:
    """The :class:`RunConfig` fields given on the command line (flags left out keep
    ``fit``'s defaults)."""
    return {f.name: getattr(args, f.name) for f in cli_fields() if hasattr(args, f.name)}


def _run_config(options: dict[str, Any]) -> RunConfig:
    """Every flag's value checked by the rules of :class:`RunConfig`; errors name the
    flag rather than the field."""
    options = dict(options)
    if isinstance(options.get("workers"), tuple):  # --workers MIN:MAX
        options["min_workers"], options["workers"] = options["workers"]
    try:
        return RunConfig(**options)
    except ConfigError as error:
        message = str(error)
        for field in cli_fields():
            if message.startswith(field.name + " "):
                flag = field.metadata.get("flag", "--" + field.name.replace("_", "-"))
                message = flag + message[len(field.name) :]
        raise type(error)(message) from None


def _fit_and_report(
    job: Job,
    plan: Plan | Strategy,
    args: argparse.Namespace,
    options: dict[str, Any],
    config: RunConfig,
) -> int:
    from unipar.runtime.run import fit  # noqa: PLC0415 (heavy: torch, Ray)

    if args.steps is not None:
        job = dataclasses.replace(job, steps=args.steps)
    least, most = config.least_workers, config.workers
    workers = f"{most}" if least == most else f"{least}..{most}"
    print(
        f"unipar: training {job.name} for {job.steps} steps on {workers} workers",
        flush=True,
    )
    result = fit(job, plan=plan, **options)  # joins the Ray instance started above
    print(result.summary())
    return 0


def _strategy(value: str) -> Plan | Strategy:
    """``auto``/``ddp``/``fsdp``/``tp``/``pp``, or the path of a plan's JSON file (as
    written by ``Plan.to_json()`` or ``unipar plan ... --json``)."""
    if value.endswith(".json"):
        path = Path(value)
        try:
            text = path.read_text()
        except OSError as error:
            raise ConfigError(
                f"cannot read the plan file {path} ({error.strerror or error}); pass a plan "
                "written by `unipar plan ... --json`, or a strategy name"
            ) from error
        return Plan.from_json(text, source=f"the plan file {path}")
    return Strategy.parse(value)


def add_run_options(parser: argparse.ArgumentParser) -> None:
    """One flag per :class:`RunConfig` field that carries help text (its metadata)."""
    for field in cli_fields():
        options = dict(field.metadata)
        flag = options.pop("flag", "--" + field.name.replace("_", "-"))
        if not isinstance(field.default, bool) and "default:" not in options["help"]:
            options["help"] += f" (default: {field.default})"
        parser.add_argument(flag, dest=field.name, default=argparse.SUPPRESS, **options)


def add_train_parser(commands: argparse._SubParsersAction) -> None:
    train = commands.add_parser("train", help="train a job on Ray workers")
    train.add_argument(
        "target",
        nargs="?",
        default="gpt-stdlib",
        help="built-in recipe name or a .py file defining `job`",
    )
    train.add_argument(
        "--strategy",
        default="auto",
        help="auto (the planner chooses and explains), ddp, fsdp, tp, pp (the planner "
        "completes that strategy), or PLAN.json (the output of `unipar plan ... --json` "
        "or of Plan.to_json())",
    )
    train.add_argument(
        "--address",
        default=None,
        help="HOST:PORT of a running Ray cluster's head (default: start a local one)",
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
