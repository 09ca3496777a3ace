"""``unipar simulate``: run a workload trace through a scheduling policy."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from unipar.errors import ConfigError
from unipar.sched.autoscale import ScaleConfig, ScaleRule
from unipar.sched.cluster import Cluster
from unipar.sched.fleet import make_fleet
from unipar.sched.plot import write_png
from unipar.sched.policies import PolicyName, make_policy
from unipar.sched.simulator import SimConfig, simulate
from unipar.sched.traces import default_reference_dir, load_applications
from unipar.sched.workload import read_workload


def add_simulate_parser(commands: argparse._SubParsersAction) -> None:
    parser = commands.add_parser(
        "simulate", help="simulate a shared cluster on a workload trace (no cluster needed)"
    )
    parser.add_argument("workload", type=Path, help="CSV: name,time,application,"
                        "num_replicas,batch_size[,user,deadline]")
    parser.add_argument("--policy", default="unipar", choices=[p.value for p in PolicyName])
    parser.add_argument("--nodes", type=int, default=16)
    parser.add_argument("--gpus-per-node", type=int, default=4)
    parser.add_argument("--interval", type=float, default=60.0, help="seconds between rounds")
    parser.add_argument("--restart", type=float, default=30.0, help="seconds per restart")
    parser.add_argument("--reference", type=Path, default=None,
                        help="Pollux reference data folder (default: ../shared/reference/"
                        "pollux next to the repository)")
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


def run_simulate(args: argparse.Namespace) -> int:
    reference = args.reference or default_reference_dir()
    apps = load_applications(reference)
    cluster = Cluster.uniform(args.nodes, args.gpus_per_node)
    scale = ScaleConfig(ScaleRule(args.scale_rule))
    fleet = make_fleet(cluster, args.autoscale, args.spot, args.seed, scale)
    policy = make_policy(PolicyName(args.policy))
    # a fixed-size job that asks for more GPUs than the cluster has can never run; an
    # adaptive policy runs it on what there is
    limit = None if policy.adaptive_batch else fleet.max_gpus
    specs = read_workload(args.workload, apps, max_gpus=limit)
    config = SimConfig(interval=args.interval, restart=args.restart, gpu_quota=_quota(args.quota))
    result = simulate(specs, apps, policy, cluster, config, fleet)
    summary = result.summary()
    print(
        f"{summary['policy']}: {summary['jobs']} jobs  avg JCT {summary['avg_jct_s']:.0f} s  "
        f"p99 JCT {summary['p99_jct_s']:.0f} s  makespan {summary['makespan_s']:.0f} s  "
        f"GPU utilisation {summary['gpu_utilisation']:.1%}  cost {summary['cost']:.1f}  "
        f"restarts {summary['restarts']}  preemptions {summary['preemptions']}"
    )
    args.out.mkdir(parents=True, exist_ok=True)
    result.write_json(args.out / "jobs.json")
    written = [args.out / "jobs.json"]
    if not args.no_plot:
        write_png(result, args.out / "sim.png")
        written.append(args.out / "sim.png")
    print("wrote " + ", ".join(map(str, written)))
    print(json.dumps(summary))
    return 0
