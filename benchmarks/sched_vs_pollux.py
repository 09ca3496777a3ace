"""unipar's scheduling policy against Pollux, by simulation: against the Pollux paper's
published results and against our own rendering of Pollux in the same simulator.

On the paper's 8 workloads (16 nodes x 4 GPUs, 60 s rounds, 30 s restarts) at loads 0.5,
1.0 and 1.5: unipar's policy's average JCT over Pollux's published one and over our Pollux
rendering's. Fidelity at every load: our Tiresias, Optimus+Oracle and rendering of Pollux
against their published figures. What the policy knows of job lengths: the runs above give
it each job's declared length (a live job declares its steps and ends there, as a simulated
one ends at its epochs: here that is the exact work left); it is run again (a) knowing no
lengths at all, and (b) at load 1.0 with every declared length off by a seeded factor in
[1/2, 2], for ``--seeds`` seeds. Held out: workloads resampled from the paper's 8 with
other seeds (``unipar.sched.generate``), never used to tune the policy, unipar against our
Pollux rendering. The simulator is deterministic: a repeat gives the same figure, so the
spreads are over seeds, loads or workloads, as each key says. Speed of one scheduling
round (160 jobs on 64 GPUs; 2,000 jobs on 1,024 GPUs). Autoscaling (cost and JCT against
the fixed 16 nodes, per rule, node-hours by phase, and the floor no schedule can beat) and
spot nodes with seeded preemptions.

RESULT: vs_pollux (vs published, all loads and workloads; target <= 0.9), worst_workload,
vs_pollux_sim (vs our rendering, same simulator; target <= 0.9; _min/_max over loads),
no_lengths_vs_pollux_sim, misdeclared_vs_pollux_sim (_min/_max over seeds),
held_out_vs_pollux_sim (_min/_max over seeds), tiresias_fidelity, optimus_fidelity,
pollux_fidelity (_min/_max over loads), round_160_s, round_2000_s, autoscale_cost,
autoscale_jct.

    python benchmarks/sched_vs_pollux.py [--reference DIR] [--quick]
"""

from __future__ import annotations

import argparse
import csv
import functools
import math
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np
from measure import Spread, Verdict, ratio

from unipar.goodput.throughput import Observation, fit
from unipar.sched.autoscale import ScaleConfig, ScaleRule
from unipar.sched.bound import CostFloor
from unipar.sched.cluster import Cluster
from unipar.sched.fleet import AutoscaleFleet, FixedFleet, make_fleet
from unipar.sched.generate import resample_workload
from unipar.sched.policies import PolicyName, make_policy
from unipar.sched.policies.lengths import misdeclared, unipar_policy_without_lengths
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


# -- the arithmetic (pure) ---------------------------------------------------------------


def ratio_of_means(ours: Sequence[float], theirs: Sequence[float]) -> float:
    """mean(ours) / mean(theirs) over the same workloads (NaN if either is empty or a
    run is missing)."""
    if not ours or len(ours) != len(theirs):
        return math.nan
    return ratio(float(np.mean(ours)), float(np.mean(theirs)))


def per_load(jcts: dict[tuple[str, int], float], reference: dict[tuple[str, int], float],
             loads: Sequence[str], workloads: Sequence[int]) -> dict[str, float]:
    """Each load's ratio of mean average JCTs (ours / the reference's)."""
    return {load: ratio_of_means([jcts[load, w] for w in workloads],
                                 [reference[load, w] for w in workloads]) for load in loads}


# -- the runs ----------------------------------------------------------------------------


def sweep(ref, apps, policy, loads, workloads, label: str) -> dict[tuple[str, int], float]:  # type: ignore[no-untyped-def]
    """Average JCT of ``policy`` (a factory) on every load and workload."""
    out = {}
    for load in loads:
        for w in workloads:
            specs = read_workload(ref / f"workloads-{load}" / f"workload-{w}.csv", apps)
            out[load, w] = simulate(specs, apps, policy(), Cluster.uniform(16, 4)).avg_jct
        print(f"  {label:22s} load {load}: " + " ".join(f"{out[load, w]:6.0f}"
                                                        for w in workloads), flush=True)
    return out


def held_out(ref, apps, seeds: Sequence[int], jobs: int | None) -> list[float]:  # type: ignore[no-untyped-def]
    """unipar / our Pollux rendering on a workload resampled with each seed (load 1.0)."""
    sources = [read_workload(ref / "workloads-1.0" / f"workload-{w}.csv", apps)
               for w in range(1, 9)]
    out = []
    for seed in seeds:
        specs = resample_workload(sources, 1000 + seed, jobs)
        ours = simulate(specs, apps, make_policy(PolicyName.UNIPAR), Cluster.uniform(16, 4))
        theirs = simulate(specs, apps, make_policy(PolicyName.POLLUX), Cluster.uniform(16, 4))
        out.append(ratio(ours.avg_jct, theirs.avg_jct))
        print(f"  held-out seed {1000 + seed} ({len(specs)} jobs): unipar {ours.avg_jct:.0f} s, "
              f"our Pollux {theirs.avg_jct:.0f} s, ratio {out[-1]:.3f}", flush=True)
    return out


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--reference", type=Path, default=default_reference_dir())
    parser.add_argument("--quick", action="store_true",
                        help="workload 1 only, short held-out workloads: a smoke run")
    parser.add_argument("--seeds", type=int, default=3)
    args = parser.parse_args()
    ref = args.reference
    apps = load_applications(ref)
    pub = published(ref)
    workloads = (1,) if args.quick else tuple(range(1, 9))
    seeds = range(args.seeds)
    verdict = Verdict(quick=args.quick)
    published_jct = {(p, load, w): pub[(p.value, load, f"workload-{w}")]
                     for p in (PolicyName.TIRESIAS, PolicyName.OPTIMUS, PolicyName.POLLUX)
                     for load in LOADS for w in workloads}

    def published_of(policy: PolicyName) -> dict[tuple[str, int], float]:
        return {(load, w): published_jct[policy, load, w] for load in LOADS for w in workloads}

    print("== average JCT per workload (s) ==")
    ours = {p: sweep(ref, apps, functools.partial(make_policy, p), LOADS, workloads, p.value)
            for p in (PolicyName.TIRESIAS, PolicyName.OPTIMUS, PolicyName.POLLUX,
                      PolicyName.UNIPAR)}
    no_lengths = sweep(ref, apps, unipar_policy_without_lengths, LOADS, workloads,
                       "unipar, no lengths")
    misdeclared_runs = [sweep(ref, apps, functools.partial(misdeclared, seed), ("1.0",),
                              workloads, f"unipar, misdeclared {seed}") for seed in seeds]

    print("== fidelity: ours / published, per load ==")
    fidelity = {}
    for p in (PolicyName.TIRESIAS, PolicyName.OPTIMUS, PolicyName.POLLUX):
        loads = per_load(ours[p], published_of(p), LOADS, workloads)
        fidelity[p] = Spread.of(list(loads.values()))
        print(f"  {p.value:9s} " + "  ".join(f"load {k}: {v:.3f}" for k, v in loads.items()))

    unipar, pollux_sim = ours[PolicyName.UNIPAR], ours[PolicyName.POLLUX]
    every = [(load, w) for load in LOADS for w in workloads]
    vs_pollux = ratio_of_means([unipar[k] for k in every],
                               [published_of(PolicyName.POLLUX)[k] for k in every])
    worst = max(ratio(unipar[k], published_of(PolicyName.POLLUX)[k]) for k in every)
    sim_loads = per_load(unipar, pollux_sim, LOADS, workloads)
    vs_sim = ratio_of_means([unipar[k] for k in every], [pollux_sim[k] for k in every])
    no_lengths_ratio = ratio_of_means([no_lengths[k] for k in every],
                                      [pollux_sim[k] for k in every])
    at_one = [("1.0", w) for w in workloads]
    misdeclared_ratios = [ratio_of_means([m[k] for k in at_one], [pollux_sim[k] for k in at_one])
                          for m in misdeclared_runs]
    print(f"== unipar / published Pollux {vs_pollux:.3f} (per load "
          f"{per_load(unipar, published_of(PolicyName.POLLUX), LOADS, workloads)}); / our "
          f"Pollux {vs_sim:.3f} (per load {sim_loads}); without lengths / our Pollux "
          f"{no_lengths_ratio:.3f}; misdeclared lengths / our Pollux {misdeclared_ratios} ==")
    print("== held out: resampled workloads, load 1.0 ==")
    held = Spread.of(held_out(ref, apps, seeds, 40 if args.quick else None))

    print("== one scheduling round (unipar's policy) ==")
    small = round_seconds(apps, 160, 16)
    large = round_seconds(apps, 2000, 256)
    print(f"160 jobs on 64 GPUs: {small:.3f} s ({small / 0.5:.2f} of the 0.5 s budget)")
    print(f"2000 jobs on 1024 GPUs: {large:.3f} s ({large / 5:.2f} of the 5 s budget)")
    cost_ratio, jct_ratio = autoscaling(ref, apps)
    verdict.target("vs_pollux", vs_pollux, 0.9)
    verdict.target("vs_pollux_sim", vs_sim, 0.9)
    return verdict.finish({
        "vs_pollux": vs_pollux,
        "worst_workload": worst,
        "vs_pollux_sim": Spread(vs_sim, min(sim_loads.values()), max(sim_loads.values()),
                                len(sim_loads)),
        "no_lengths_vs_pollux_sim": no_lengths_ratio,
        "misdeclared_vs_pollux_sim": Spread.of(misdeclared_ratios),
        "held_out_vs_pollux_sim": held,
        "tiresias_fidelity": fidelity[PolicyName.TIRESIAS],
        "optimus_fidelity": fidelity[PolicyName.OPTIMUS],
        "pollux_fidelity": fidelity[PolicyName.POLLUX],
        "round_160_s": small,
        "round_2000_s": large,
        "autoscale_cost": cost_ratio,
        "autoscale_jct": jct_ratio,
    })


def autoscaling(ref, apps) -> tuple[float, float]:  # type: ignore[no-untyped-def]
    """Autoscaling and spot nodes on workload-1 at load 1.0: (cost, JCT) of the default
    rule (price) against the fixed 16 nodes."""
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
    print(f"spot 16 nodes, 0.1 preemptions/node-hour (seed 0): avg JCT {spot.avg_jct:.0f} s  "
          f"cost {spot.cost:.0f}  jobs done {len(spot.jobs)}/{len(fixed.jobs)}  "
          f"preempted jobs {spot.summary()['preemptions']}")
    assert scaled is not None
    return scaled.cost / fixed.cost, scaled.avg_jct / fixed.avg_jct


if __name__ == "__main__":
    sys.exit(main())
