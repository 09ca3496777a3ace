"""unipar's scheduling policy against the Pollux paper's published results, by simulation.

On the paper's 8 workloads (16 nodes x 4 GPUs, 60 s rounds, 30 s restarts) at loads 0.5,
1.0 and 1.5: unipar's policy's average JCT over Pollux's published one. Fidelity at load
1.0: our Tiresias, Optimus+Oracle and rendering of Pollux against their published figures.
Speed of one scheduling round (160 jobs on 64 GPUs; 2,000 jobs on 1,024 GPUs). Autoscaling
(cost and JCT against the fixed 16 nodes, per rule, node-hours by phase, and the floor no
schedule can beat) and spot nodes with seeded preemptions.

    python benchmarks/sched_vs_pollux.py [--reference DIR] [--quick]
"""

from __future__ import annotations

import argparse
import csv
import time
from pathlib import Path

import numpy as np

from unipar.goodput.throughput import Observation, fit
from unipar.sched.autoscale import ScaleConfig, ScaleRule
from unipar.sched.bound import CostFloor
from unipar.sched.cluster import Cluster
from unipar.sched.fleet import AutoscaleFleet, FixedFleet, make_fleet
from unipar.sched.policies import PolicyName, make_policy
from unipar.sched.policy import JobView, RoundState
from unipar.sched.simulator import simulate
from unipar.sched.traces import default_reference_dir, load_applications
from unipar.sched.workload import read_workload

LOADS = ("0.5", "1.0", "1.5")


def published(reference: Path) -> dict[tuple[str, str, str], float]:
    with (reference / "published_avg_jct.csv").open() as f:
        return {(r["policy"], r["load"], r["workload"]): float(r["avg_jct_s"])
                for r in csv.DictReader(f)}


def run(reference, apps, policy: PolicyName, load: str, workload: int, fleet=None):
    specs = read_workload(reference / f"workloads-{load}" / f"workload-{workload}.csv", apps)
    return simulate(specs, apps, make_policy(policy), Cluster.uniform(16, 4), fleet=fleet)


def phases(result, fleet, last_submit: float) -> str:
    """Node-hours while jobs still arrive, after the last arrival, with at most 4 jobs
    running; GPU-hours held idle; rounds at the minimum size (one node)."""
    nodes = np.array([n for _, n in fleet.history], dtype=float)
    start = np.array([t for t, _ in fleet.history])
    used = np.array([sum(snap.values()) for _, snap in result.timeline], dtype=float)
    running = np.array([len(snap) for _, snap in result.timeline])
    hours = 60.0 / 3600.0  # one 60 s round
    burst = start <= last_submit
    return (f"arrivals {nodes[burst].sum() * hours:.1f}, after the last arrival "
            f"{nodes[~burst].sum() * hours:.1f} (<= 4 jobs running: "
            f"{nodes[running <= 4].sum() * hours:.1f}); idle GPU-hours "
            f"{(nodes * result.gpus_per_node - used).sum() * hours:.1f}; rounds on 1 node "
            f"{int((nodes == 1).sum())}")


def synthetic_round(apps, jobs: int, nodes: int, seed: int = 0) -> RoundState:
    """A busy round: ``jobs`` running jobs of the paper's mix, each having reported step
    times at a few spreads (so each has a fitted model), on ``nodes`` x 4 GPUs."""
    rng = np.random.default_rng(seed)
    names = sorted(apps)
    views = []
    for i in range(jobs):
        app = apps[names[i % len(names)]]
        obs = []
        spreads = [(1,), (2,), (4,), (4, 4), (4,) * 4, (4,) * 8, (4,) * 16]
        for placement in spreads[: 1 + i % len(spreads)]:
            m = app.max_local_bsz
            step, sync = app.step_time(placement, m)
            obs.append(Observation(len(placement), sum(placement), m, step, sync))
        progress = float(rng.uniform(0, 0.9)) * app.target_progress
        sqr, var = app.grad_stats(app.init_batch, progress)
        seen = sum(spreads[i % len(spreads)])  # so a job may be given up to twice that
        views.append(JobView(
            name=f"job-{i}", submit_time=float(i), requested_replicas=4,
            requested_batch=app.init_batch * 4, init_batch=app.init_batch,
            max_batch=app.max_batch, min_local=app.min_local_bsz, max_local=app.max_local_bsz,
            progress=progress, attained_service=float(rng.uniform(0, 1e5)), run_time=600.0,
            restarts=int(rng.integers(0, 5)), max_replicas_seen=seen, allocation=None,
            model=fit(obs), grad_sqr=sqr, grad_var=var,
        ))
    return RoundState(now=1e5, cluster=Cluster.uniform(nodes, 4), jobs=views,
                      available_nodes=tuple(range(nodes)))


def round_seconds(apps, jobs: int, nodes: int) -> float:
    state = synthetic_round(apps, jobs, nodes)
    policy = make_policy(PolicyName.UNIPAR)
    policy.allocate(state)  # warm
    best = float("inf")
    for _ in range(3):
        t = time.perf_counter()
        policy.allocate(state)
        best = min(best, time.perf_counter() - t)
    return best


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--reference", type=Path, default=default_reference_dir())
    parser.add_argument("--quick", action="store_true", help="workloads 1-2 only")
    args = parser.parse_args()
    ref = args.reference
    apps = load_applications(ref)
    pub = published(ref)
    workloads = (1, 2) if args.quick else tuple(range(1, 9))

    print("== fidelity at load 1.0: ours / published average JCT ==")
    fidelity = {}
    for policy in (PolicyName.TIRESIAS, PolicyName.OPTIMUS, PolicyName.POLLUX):
        ours, theirs = [], []
        for w in workloads:
            r = run(ref, apps, policy, "1.0", w)
            p = pub[(policy.value, "1.0", f"workload-{w}")]
            ours.append(r.avg_jct)
            theirs.append(p)
            print(f"{policy.value:9s} workload-{w}: ours {r.avg_jct:7.0f} s  published "
                  f"{p:7.0f} s  ratio {r.avg_jct / p:.2f}")
        fidelity[policy] = np.mean(ours) / np.mean(theirs)
        print(f"{policy.value:9s} mean: ours {np.mean(ours):.0f} s  published "
              f"{np.mean(theirs):.0f} s  ratio {fidelity[policy]:.3f}")

    print("== unipar's policy / published Pollux, average JCT ==")
    ours_all, pub_all, ratios = [], [], []
    for load in LOADS:
        ours, theirs = [], []
        for w in workloads:
            r = run(ref, apps, PolicyName.UNIPAR, load, w)
            p = pub[("pollux", load, f"workload-{w}")]
            ours.append(r.avg_jct)
            theirs.append(p)
            ratios.append(r.avg_jct / p)
            print(f"load {load} workload-{w}: unipar {r.avg_jct:7.0f} s  Pollux {p:7.0f} s  "
                  f"ratio {r.avg_jct / p:.2f}  restarts {r.summary()['restarts']}")
        print(f"load {load} mean: unipar {np.mean(ours):.0f} s  Pollux {np.mean(theirs):.0f} s"
              f"  ratio {np.mean(ours) / np.mean(theirs):.3f}")
        ours_all += ours
        pub_all += theirs
    vs_pollux = np.mean(ours_all) / np.mean(pub_all)

    print("== one scheduling round (unipar's policy) ==")
    small = round_seconds(apps, 160, 16)
    large = round_seconds(apps, 2000, 256)
    print(f"160 jobs on 64 GPUs: {small:.3f} s ({small / 0.5:.2f} of the 0.5 s budget)")
    print(f"2000 jobs on 1024 GPUs: {large:.3f} s ({large / 5:.2f} of the 5 s budget)")

    print("== autoscaling and spot, workload-1 at load 1.0 ==")
    fixed_fleet = FixedFleet(Cluster.uniform(16, 4))
    fixed = run(ref, apps, PolicyName.UNIPAR, "1.0", 1, fleet=fixed_fleet)
    print(f"fixed 16 nodes: avg JCT {fixed.avg_jct:.0f} s  cost {fixed.cost:.0f}")
    last_submit = max(j.submit_time for j in fixed.jobs)
    print("  node-hours by phase: " + phases(fixed, fixed_fleet, last_submit))
    scaled = None
    for rule in (ScaleRule.PRICE, ScaleRule.UTILITY, ScaleRule.DEMAND):
        fleet = AutoscaleFleet(Cluster.uniform(16, 4), 1, ScaleConfig(rule))
        r = run(ref, apps, PolicyName.UNIPAR, "1.0", 1, fleet=fleet)
        scaled = scaled or r  # the default rule (price) is the one reported
        print(f"autoscaled 1..16, rule {rule.value}: avg JCT {r.avg_jct:.0f} s  cost "
              f"{r.cost:.0f}  (cost x{r.cost / fixed.cost:.3f}, JCT x"
              f"{r.avg_jct / fixed.avg_jct:.3f})")
        print("  node-hours by phase: " + phases(r, fleet, last_submit))
    specs = read_workload(ref / "workloads-1.0" / "workload-1.csv", apps)
    floor = CostFloor(specs, apps).gpu_seconds(1.1 * float(fixed.jcts.sum()))
    print(f"cost floor of any schedule at JCT <= 1.1x (no queue, no restart, GPUs chosen per "
          f"epoch): x{floor / (fixed.node_seconds * 4):.3f} of the fixed cluster's node-hours")
    spot = run(ref, apps, PolicyName.UNIPAR, "1.0", 1,
               fleet=make_fleet(Cluster.uniform(16, 4), None, spot_rate=0.1, seed=0))
    cost_ratio = scaled.cost / fixed.cost
    jct_ratio = scaled.avg_jct / fixed.avg_jct
    print(f"spot 16 nodes, 0.1 preemptions/node-hour (seed 0): avg JCT {spot.avg_jct:.0f} s  "
          f"cost {spot.cost:.0f}  jobs done {len(spot.jobs)}/{len(fixed.jobs)}  "
          f"preempted jobs {spot.summary()['preemptions']}")
    print(
        f"RESULT vs_pollux={vs_pollux:.3f} worst_workload={max(ratios):.3f} "
        f"tiresias_fidelity={fidelity[PolicyName.TIRESIAS]:.3f} "
        f"optimus_fidelity={fidelity[PolicyName.OPTIMUS]:.3f} "
        f"pollux_fidelity={fidelity[PolicyName.POLLUX]:.3f} "
        f"round_160_s={small:.3f} round_2000_s={large:.3f} "
        f"autoscale_cost={cost_ratio:.3f} autoscale_jct={jct_ratio:.3f}"
    )


if __name__ == "__main__":
    main()
