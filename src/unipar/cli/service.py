"""``unipar up / submit / jobs / logs / cancel / down``: the shared cluster's commands."""

from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path

from unipar import checks
from unipar.job_file import check_target, load_job
from unipar.runtime.config import parse_workers
from unipar.sched.policies import PolicyName


def parse_throughput(text: str) -> dict[str, float]:
    """``--throughput``: ``a=100,b=200`` (samples per second on one worker of each node
    type)."""
    try:
        return {name.strip(): float(value)
                for name, value in (part.split("=") for part in text.split(","))}
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"--throughput takes TYPE=SAMPLES_PER_S parts joined by commas (like a=100,b=200), "
            f"not {text!r}"
        ) from None


def add_service_parsers(commands: argparse._SubParsersAction) -> None:
    def common(parser: argparse.ArgumentParser) -> None:
        parser.add_argument("--address", default=None,
                            help="HOST:PORT of the cluster's head (default: the one "
                            "`unipar up` recorded in the state directory)")
        parser.add_argument("--state-dir", type=Path, default=None,
                            help="the scheduler's state directory (default: ~/.unipar)")

    up = commands.add_parser("up", help="start (or join) a cluster and its scheduler")
    common(up)
    up.add_argument("--policy", default=PolicyName.UNIPAR.value,
                    choices=[PolicyName.UNIPAR.value, PolicyName.FIFO.value])
    up.add_argument("--interval", type=float, default=10.0, help="seconds between rounds")
    up.add_argument("--num-cpus", type=int, default=None,
                    help="CPUs of a cluster started here (default: all)")
    up.add_argument("--port", type=int, default=6379, help="port of a cluster started here")
    up.set_defaults(handler=_up)

    submit = commands.add_parser("submit", help="queue a job on the shared cluster")
    common(submit)
    submit.add_argument("target", help="built-in recipe name or a .py file defining `job`")
    submit.add_argument("--workers", type=parse_workers, default=(1, 8),
                        help="a number, or MIN:MAX (default 1:8)")
    submit.add_argument("--priority", type=int, default=0, help="higher runs first")
    submit.add_argument("--deadline", default=None,
                        help="+30m, +2h, +1d or an ISO time (2026-11-24T09:00)")
    submit.add_argument("--user", default=None, help="default: your login name")
    submit.add_argument("--throughput", type=parse_throughput, default=None,
                        help="on a cluster of several node types: samples/s on one worker "
                        "of each, like a=100,b=200")
    submit.add_argument("--steps", type=int, default=None, help="override the job's steps")
    submit.set_defaults(handler=_submit)

    jobs = commands.add_parser("jobs", help="the shared cluster's jobs, live")
    common(jobs)
    jobs.set_defaults(handler=_jobs)

    for name, helptext, handler in (("logs", "a job's log", _logs),
                                    ("cancel", "stop a queued or running job", _cancel)):
        parser = commands.add_parser(name, help=helptext)
        common(parser)
        parser.add_argument("job", type=int, help="the job's number (`unipar jobs`)")
        parser.set_defaults(handler=handler)

    down = commands.add_parser("down", help="stop the scheduler and its jobs")
    common(down)
    down.set_defaults(handler=_down)


def _connected(args: argparse.Namespace):  # type: ignore[no-untyped-def]
    from unipar.service import client  # noqa: PLC0415 (heavy: Ray)

    client.connect(args.address, args.state_dir)
    return client


def _up(args: argparse.Namespace) -> int:
    from unipar.service import client  # noqa: PLC0415 (heavy: Ray)

    info = client.up(args.address, state_dir=args.state_dir, policy=args.policy,
                     interval_s=args.interval, num_cpus=args.num_cpus, port=args.port)
    print(f"unipar: scheduler up ({info['policy']} policy, a round every "
          f"{info['interval_s']:g} s, state in {info['state_dir']})")
    return 0


def _submit(args: argparse.Namespace) -> int:
    from unipar.service import client  # noqa: PLC0415 (heavy: Ray)

    check_target(args.target)
    least, most = client.check_workers(args.workers)
    client.parse_deadline(args.deadline)  # refused before the job file runs
    client.connect(args.address, args.state_dir)  # no cluster: said before loading the job
    job = load_job(args.target)
    if args.steps is not None:
        job = dataclasses.replace(job, steps=checks.integer("--steps", args.steps, minimum=1))
    handle = client.submit(job, workers=(least, most), priority=args.priority,
                           deadline=args.deadline, user=args.user, address=args.address,
                           state_dir=args.state_dir, throughput=args.throughput)
    print(f"unipar: submitted job {handle.id} ({job.name})")
    return 0


def _jobs(args: argparse.Namespace) -> int:
    client = _connected(args)
    print(client.format_jobs(client.jobs()))
    return 0


def _logs(args: argparse.Namespace) -> int:
    print(_connected(args).logs(args.job))
    return 0


def _cancel(args: argparse.Namespace) -> int:
    row = _connected(args).cancel(args.job)
    print(f"unipar: job {row.id} {row.state.value}")
    return 0


def _down(args: argparse.Namespace) -> int:
    _connected(args).down()
    print("unipar: scheduler and its jobs stopped; the Ray cluster stays up (`ray stop` on "
          "its machines ends it)")
    return 0
