"""The ``unipar`` command."""

from __future__ import annotations

import argparse
import dataclasses
import runpy
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING

from unipar.errors import ConfigError, UniparError
from unipar.plan import Plan, Strategy
from unipar.plan_cli import add_plan_parser

if TYPE_CHECKING:
    from unipar.job import Job


def check_target(target: str) -> None:
    """Fail fast, before Ray starts, on a target that names nothing."""
    from unipar.recipes import RECIPES

    path = Path(target)
    if target not in RECIPES and (path.suffix != ".py" or not path.is_file()):
        raise ConfigError(
            f"{target!r} is neither a built-in recipe ({', '.join(sorted(RECIPES))}) nor an "
            "existing .py file"
        )


def load_job(target: str) -> Job:
    """A built-in recipe by name, or a Python file defining ``job`` (a Job or a
    function returning one)."""
    from unipar.job import Job
    from unipar.recipes import RECIPES, recipe

    check_target(target)
    if target in RECIPES:
        return recipe(target)
    path = Path(target)
    namespace = runpy.run_path(str(path), run_name="__unipar_job__")
    job = namespace.get("job")
    if callable(job) and not isinstance(job, Job):
        job = job()
    if not isinstance(job, Job):
        raise ConfigError(
            f"{path} must define `job`, a unipar.Job or a function returning one, "
            f"but it defines {type(job).__name__}"
        )
    return job


def _train(args: argparse.Namespace) -> int:
    import ray

    from unipar.ray_session import start_ray

    check_target(args.target)
    plan = _strategy(args.strategy)  # a bad value fails before Ray starts
    # Ray's start is partly waiting on its own processes: load the job (importing torch)
    # meanwhile. Ray stays on the main thread: its processes die with the thread that
    # started them.
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="unipar-load-job") as pool:
        loading = pool.submit(load_job, args.target)
        start_ray(args.address)
        try:
            job = loading.result()
        except BaseException:
            ray.shutdown()
            raise
    try:
        return _fit_and_report(job, plan, args)
    finally:
        ray.shutdown()


def _worker_range(text: str) -> int | tuple[int, int]:
    """``4`` or ``2:8`` (the fewest and the most workers)."""
    try:
        if ":" in text:
            least, most = text.split(":")
            return int(least), int(most)
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"--workers takes a number or a range MIN:MAX (like 2:8), not {text!r}"
        ) from None


def _fit_and_report(job: Job, plan: Plan | Strategy, args: argparse.Namespace) -> int:
    from unipar.runtime.fit import fit

    if args.steps is not None:
        job = dataclasses.replace(job, steps=args.steps)
    workers = args.workers if isinstance(args.workers, int) else "{}..{}".format(*args.workers)
    print(f"unipar: training {job.name} for {job.steps} steps on {workers} workers", flush=True)
    result = fit(
        job,
        workers=args.workers,
        plan=plan,
        cpus_per_worker=args.cpus_per_worker,
        gpus_per_worker=args.gpus_per_worker,
        run_dir=args.run_dir,
        checkpoint_dir=args.checkpoint_dir,
        checkpoint_every=args.checkpoint_every,
        resume=True if args.resume == "latest" else (args.resume or False),
        max_failures=args.max_failures,
        address=args.address,
        progress=not args.no_progress,
    )
    print(result.summary())
    return 0


def _strategy(value: str) -> Plan | Strategy:
    """``auto``/``ddp``/``fsdp``/``tp``/``pp``, or the path of a plan's JSON file."""
    if value.endswith(".json"):
        path = Path(value)
        try:
            return Plan.from_json(path.read_text())
        except OSError as error:
            raise ConfigError(
                f"cannot read the plan file {path} ({error.strerror or error}); pass a plan "
                "written by `unipar plan ... --json`, or a strategy name"
            ) from error
    return Strategy.parse(value)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="unipar", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    train = commands.add_parser("train", help="train a job on Ray workers")
    train.add_argument(
        "target",
        nargs="?",
        default="gpt-stdlib",
        help="built-in recipe name or a .py file defining `job`",
    )
    train.add_argument(
        "--workers",
        type=_worker_range,
        default=2,
        help="a number, or a range MIN:MAX to train elastically on as many as the cluster "
        "gives (default 2)",
    )
    train.add_argument(
        "--strategy",
        default="auto",
        help="auto (the planner chooses and explains), ddp, fsdp, tp, pp (the planner "
        "completes that strategy), or PLAN.json (a plan as written by Plan.to_json)",
    )
    train.add_argument(
        "--address",
        default=None,
        help="address of a running Ray cluster (default: start a local one)",
    )
    train.add_argument("--steps", type=int, default=None, help="override the job's steps")
    train.add_argument("--run-dir", default=None, help="metrics and checkpoints go here")
    train.add_argument("--checkpoint-dir", default=None, help="default: RUN_DIR/checkpoints")
    train.add_argument("--checkpoint-every", type=int, default=None)
    train.add_argument(
        "--resume",
        nargs="?",
        const="latest",
        default=None,
        help="resume from the newest checkpoint, or from PATH",
    )
    train.add_argument("--cpus-per-worker", type=float, default=1.0)
    train.add_argument("--gpus-per-worker", type=float, default=0.0)
    train.add_argument("--max-failures", type=int, default=3)
    train.add_argument("--no-progress", action="store_true")
    train.set_defaults(handler=_train)
    add_plan_parser(commands)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.handler(args)
    except UniparError as error:
        print(f"unipar: error: {error}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
