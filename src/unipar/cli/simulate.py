"""``unipar simulate``: run a workload trace through a scheduling policy."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np

from unipar.errors import ConfigError
from unipar.sched.autoscale import ScaleConfig, ScaleRule
from unipar.sched.bound import CostFloor
from unipar.sched.cluster import Cluster
from unipar.sched.fleet import FixedFleet, make_fleet
from unipar.sched.plot import write_png
from unipar.sched.policies import PolicyName, TypedPolicyName, make_policy, make_typed_policy
from unipar.sched.simulator import SimConfig, simulate
from unipar.sched.traces import default_reference_dir, load_applications
from unipar.sched.typed_cluster import load_cluster
from unipar.sched.typed_simulator import TypedSimConfig, simulate_typed
from unipar.sched.typed_traces import (
    check_traced,
    default_sia_reference_dir,
    load_typed_applications,
)
from unipar.sched.workload import read_workload


def add_simulate_parser(commands: argparse._SubParsersAction) -> None:
    parser = commands.add_parser(
        "simulate", help="simulate a shared cluster on a workload trace (no cluster needed)"
    )
    parser.add_argument("workload", type=Path, help="CSV: name,time,application,"
                        "num_replicas,batch_size[,user,deadline]")
    names = dict.fromkeys([p.value for p in PolicyName] + [p.value for p in TypedPolicyName])
    parser.add_argument("--policy", default="unipar", choices=list(names))
    parser.add_argument("--cluster", default=None, metavar="NODESxTYPE+...|FILE",
                        help="nodes of several GPU types, e.g. 6xaws+2xdgx-ext+3xrtx, or a "
                        "CSV file type,nodes[,gpus_per_node,memory_gib,...] (Sia's traces); "
                        "policies unipar, sia, pollux")
    parser.add_argument("--nodes", type=int, default=None, help="one GPU type: nodes (16)")
    parser.add_argument("--gpus-per-node", type=int, default=None,
                        help="one GPU type: GPUs per node (4)")
    parser.add_argument("--interval", type=float, default=60.0, help="seconds between rounds")
    parser.add_argument("--restart", type=float, default=None,
                        help="seconds per restart (30; with --cluster each application's own)")
    parser.add_argument("--reference", type=Path, default=None,
                        help="reference data folder (default: ../shared/reference/pollux "
                        "next to the repository; with --cluster ../shared/reference/sia)")
    parser.add_argument("--out", type=Path, default=Path("sim-out"),
                        help="folder for jobs.json and sim.png")
    parser.add_argument("--no-plot", action="store_true", help="skip the PNG")
    parser.add_argument("--autoscale", default=None, metavar="MIN:MAX",
                        help="grow and shrink between MIN and MAX nodes by utility")
    parser.add_argument("--scale-rule", default="price", choices=["price", "utility", "demand"],
                        help="how --autoscale picks the node count (see sched/autoscale.py)")
    parser.add_argument("--spot", type=float, default=0.0, metavar="RATE",
                        help="nodes are spot, each preempted RATE times per hour (seeded)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--quota", default=None, metavar="USER=GPUS,...",
                        help="per-user GPU quota")
    parser.set_defaults(handler=run_simulate)


def _quota(text: str | None) -> tuple[tuple[str, int], ...]:
    if not text:
        return ()
    out = []
    for item in text.split(","):
        user, _, gpus = item.partition("=")
        if not user or not gpus.isdigit():
            raise ConfigError(f"--quota wants USER=GPUS,... but got {item!r}")
        out.append((user, int(gpus)))
    return tuple(out)


JCT_SLACK = 1.1  # the floor is priced at an average JCT at most this times the fixed run's


def _against_fixed(specs, apps, name: PolicyName, fleet, config, scaled) -> str:
    """The autoscaled run against the fixed cluster of its most nodes (a fresh policy of
    the same kind, the same workload), and the floor no schedule can go under
    (:mod:`unipar.sched.bound`) at an average JCT of at most ``JCT_SLACK`` times the
    fixed run's."""
    cluster = fleet.cluster
    fixed = simulate(specs, apps, make_policy(name), cluster, config, FixedFleet(cluster))
    floor = CostFloor(specs, apps, cluster.total_gpus, cluster.gpus_per_node)
    least = floor.gpu_seconds(JCT_SLACK * float(fixed.jcts.sum()))
    return (
        f"against the fixed {cluster.num_nodes} nodes (cost {fixed.cost:.1f}, avg JCT "
        f"{fixed.avg_jct:.0f} s): cost x{scaled.cost / fixed.cost:.3f} at avg JCT "
        f"x{scaled.avg_jct / fixed.avg_jct:.3f}; floor of any schedule at avg JCT <= "
        f"x{JCT_SLACK}: x{least / (fixed.node_seconds * cluster.gpus_per_node):.3f}"
    )


def _check_typed_args(args: argparse.Namespace) -> None:
    if args.cluster is None:
        if args.policy == TypedPolicyName.SIA.value:
            raise ConfigError(
                "--policy sia schedules several GPU types: give the cluster with --cluster "
                "(e.g. --cluster 6xaws+2xdgx-ext+3xrtx)"
            )
        return
    if args.policy not in {p.value for p in TypedPolicyName}:
        raise ConfigError(
            f"--policy {args.policy} knows one GPU type; with --cluster use one of "
            f"{', '.join(p.value for p in TypedPolicyName)}"
        )
    given = [f for f, v in (("--nodes", args.nodes), ("--gpus-per-node", args.gpus_per_node),
                            ("--restart", args.restart), ("--autoscale", args.autoscale),
                            ("--quota", args.quota)) if v is not None]
    if args.spot:
        given.append("--spot")
    if given:
        raise ConfigError(
            f"{', '.join(given)} apply to a one-type cluster, not with --cluster (its node "
            "counts are in the cluster, restart times per application in the traces); drop them"
        )


def _summary_line(summary: dict) -> str:
    return (
        f"{summary['policy']}: {summary['jobs']} jobs  avg JCT {summary['avg_jct_s']:.0f} s  "
        f"p99 JCT {summary['p99_jct_s']:.0f} s  makespan {summary['makespan_s']:.0f} s  "
        f"GPU utilisation {summary['gpu_utilisation']:.1%}  cost {summary['cost']:.1f}  "
        f"restarts {summary['restarts']}  preemptions {summary['preemptions']}"
    )


def _write(result, args: argparse.Namespace, *, then: str | None = None) -> None:
    """Write the run's jobs.json (and sim.png), print ``then`` (a line that follows the
    run), the files written and the summary as JSON."""
    args.out.mkdir(parents=True, exist_ok=True)
    result.write_json(args.out / "jobs.json")
    written = [args.out / "jobs.json"]
    if not args.no_plot:
        write_png(result, args.out / "sim.png")
        written.append(args.out / "sim.png")
    if then is not None:
        print(then)
    print("wrote " + ", ".join(map(str, written)))
    print(json.dumps(result.summary()))


def _run_typed(args: argparse.Namespace) -> int:
    cluster = load_cluster(args.cluster)
    apps = load_typed_applications(args.reference or default_sia_reference_dir())
    specs = read_workload(args.workload, apps)
    check_traced(specs, apps, cluster.type_names, args.workload)
    policy = make_typed_policy(TypedPolicyName(args.policy))
    run = simulate_typed(specs, apps, policy, cluster, TypedSimConfig(interval=args.interval))
    print(f"cluster {cluster.describe()} ({cluster.total_gpus} GPUs)")
    print(_summary_line(run.result.summary()))
    hours = ", ".join(f"{t} {s / 3600:.1f}" for t, s in run.gpu_seconds_by_type.items())
    print(f"GPU-hours by type: {hours}; per job {run.result.gpu_seconds / 3600 / len(specs):.2f}"
          f"; moves between types {run.migrations}; policy round median "
          f"{float(np.median(run.round_seconds)) * 1e3:.1f} ms")
    _write(run.result, args)
    return 0


def run_simulate(args: argparse.Namespace) -> int:
    _check_typed_args(args)
    if args.cluster is not None:
        return _run_typed(args)
    reference = args.reference or default_reference_dir()
    apps = load_applications(reference)
    cluster = Cluster.uniform(args.nodes or 16, args.gpus_per_node or 4)
    scale = ScaleConfig(ScaleRule(args.scale_rule))
    fleet = make_fleet(cluster, args.autoscale, args.spot, args.seed, scale)
    policy = make_policy(PolicyName(args.policy))
    # a fixed-size job that asks for more GPUs than the cluster has can never run; an
    # adaptive policy runs it on what there is
    limit = None if policy.adaptive_batch else fleet.max_gpus
    specs = read_workload(args.workload, apps, max_gpus=limit)
    config = SimConfig(interval=args.interval, restart=30.0 if args.restart is None
                       else args.restart, gpu_quota=_quota(args.quota))
    result = simulate(specs, apps, policy, cluster, config, fleet)
    print(_summary_line(result.summary()))
    against = None
    if args.autoscale:
        against = _against_fixed(specs, apps, PolicyName(args.policy), fleet, config, result)
    _write(result, args, then=against)
    return 0
