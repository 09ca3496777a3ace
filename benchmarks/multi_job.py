"""Four jobs on one shared 4-CPU cluster: unipar's scheduler (goodput policy, jobs resized
live) against FIFO at each job's requested size and a static fair share.

The same four MLP jobs (requesting 4, 1, 2 and 2 workers for 800, 120, 300 and 120 steps)
arrive 4 s apart, in ``--orders`` arrival orders (the long job first, last, and in the
middle), in two variants:

- sleep-bound: each sample costs ``--delay`` seconds of data loading (a stand-in for I/O),
  so a job speeds up perfectly with workers even on 2 cores: resizing's best case;
- compute-bound: real training, no sleep (a wider MLP, batch 64): 4 workers share the
  machine's 2 cores, so more workers help a job little.

Policies, each through ``unipar up`` on one local Ray instance: (a) ``fifo`` with each
job's ``workers`` fixed at its request (a job waits until its size is free); (b) a static
fair share: every job fixed at an equal share of the cluster (4 workers / 4 jobs: 1 each),
admitted FIFO; (c) ``unipar`` with ``workers=1:4``. Within each (variant, order) the
policies run in an order rotated from one to the next, after one short unmeasured job
(:func:`warm_up`). Job completion time (JCT) is from submission to the end (printed per job
as queued + start-up + training); makespan from the first submission to the last end.
Checks: every job ends DONE, and its per-step losses equal those of the same job trained
alone in one process (the same global batch and samples). Each step's allowance is
``max(LOSS_RTOL, NOISE_FACTOR * floor)``, where ``floor`` is how far that one-process
reference drifts from itself by that step when only its thread count changes (1 against
2): after 800 steps the reference differs from itself by 5.6e-4 (sleep-bound) and 4.4e-3
(compute-bound), so a fixed 1e-4 would test the reference's own rounding, not the runs. A
wrong or skipped batch changes a step's loss by 6-30% (median step-to-step change),
far outside the allowance.

RESULT: avg_jct_ratio (unipar / FIFO average JCT, median over every variant and order;
target <= 0.7), makespan_ratio, avg_jct_ratio_sleep, avg_jct_ratio_compute,
avg_jct_vs_fair (unipar / static fair share); each with _min/_max.
"""

from __future__ import annotations

import argparse
import enum
import functools
import math
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
from measure import (
    Spread,
    Verdict,
    add_common_arguments,
    max_relative_difference,
    order_of,
    paired_ratios,
    rounding_floor,
    worst_over_envelope,
)

from unipar.job import Job, OptimizerSpec
from unipar.models.mlp import MLP, MLPConfig
from unipar.ray_cluster.session import start_ray
from unipar.runtime.metrics import read_metrics
from unipar.service import client
from unipar.service.state import JobState
from unipar.testing import RandomRegression, SlowRegression, mse_loss, single_process_losses

# (name, requested workers, steps). Each job trains at its requested size at least as long
# as its start-up takes (two fresh Ray processes importing torch, 5-7 s on a quiet 2-core
# machine): with half these lengths the comparison was mostly one of process start-ups.
JOBS = (("long-4", 4, 800), ("short-1", 1, 120), ("mid-2", 2, 300), ("short-2", 2, 120))
ARRIVAL_GAP_S = 4.0
# Arrival orders (indices into JOBS): the long job first (FIFO's worst case), last, middle.
ORDERS = {"long-first": (0, 1, 2, 3), "long-last": (1, 3, 2, 0), "long-middle": (1, 0, 3, 2)}
POLICIES = ("fifo", "fair", "unipar")
CLUSTER_WORKERS = 4
LOSS_RTOL = 1e-4
LOSS_ATOL = 1e-6
# Fixed-size runs measured 1.3-2.5x the floor (4 replicas sum in another order than one
# process, and their drift grows the same way); 10x leaves room for resizes' other orders.
NOISE_FACTOR = 10.0


class Variant(enum.Enum):
    SLEEP = "sleep"
    COMPUTE = "compute"


def make_job(name: str, steps: int, variant: Variant, delay: float) -> Job:
    """The job ``name``; ``delay`` 0 gives the same job without its sleep (the same data)."""
    if variant == Variant.SLEEP:
        config = MLPConfig(in_features=16, hidden=32, layers=2, out_features=4, expansion=4)
        dataset = functools.partial(SlowRegression, 512, 16, 4, delay)
        batch, lr = 8, 1e-2
    else:
        # at lr 1e-2 this wider MLP diverges (loss 11.6 after 300 steps), and a divergent
        # run amplifies the last bit of a sum's order: 4 replicas' losses then differ from
        # one process's by 1100%; at 1e-3 it trains (0.04), within 1e-6 of one process
        config = MLPConfig(in_features=64, hidden=256, layers=4, out_features=8, expansion=4)
        dataset = functools.partial(RandomRegression, 2048, 64, 8)
        batch, lr = 64, 1e-3
    return Job(name=name, model=functools.partial(MLP, config), dataset=dataset,
               global_batch_size=batch, steps=steps, optimizer=OptimizerSpec(lr=lr),
               loss=mse_loss)


# -- the arithmetic (pure) ---------------------------------------------------------------


@dataclass(frozen=True)
class JobOutcome:
    name: str
    done: bool
    submitted: float
    ended: float | None
    losses_match: bool


@dataclass(frozen=True)
class PolicyRun:
    avg_jct: float  # NaN when a job failed or trained other losses than it has alone
    makespan: float


def policy_run(jobs: Sequence[JobOutcome]) -> PolicyRun:
    """Average JCT and makespan; missing (NaN) unless every job is DONE with the losses it
    has alone: a failed job must not lower the average."""
    if not jobs or not all(j.done and j.losses_match and j.ended is not None for j in jobs):
        return PolicyRun(float("nan"), float("nan"))
    jct = [j.ended - j.submitted for j in jobs]  # type: ignore[operator]
    makespan = max(j.ended for j in jobs) - min(j.submitted for j in jobs)  # type: ignore[type-var]
    return PolicyRun(statistics.mean(jct), makespan)


def arrivals(order: Sequence[int], scale: float) -> list[tuple[str, int, int, float]]:
    """(name, requested workers, steps, arrival second) in the order's sequence."""
    return [(JOBS[i][0], JOBS[i][1], max(1, int(JOBS[i][2] * scale)), k * ARRIVAL_GAP_S)
            for k, i in enumerate(order)]


def workers_for(policy: str, requested: int) -> tuple[int, int]:
    """The ``workers`` range a job is submitted with under ``policy``."""
    if policy == "fifo":
        return requested, requested
    if policy == "fair":
        share = CLUSTER_WORKERS // len(JOBS)
        return share, share
    return 1, CLUSTER_WORKERS


# -- the runs ----------------------------------------------------------------------------


@dataclass(frozen=True)
class Reference:
    losses: list[float]  # one process, this process's thread count
    floor: list[float]  # per step: its drift from itself at another thread count


def reference_of(job: Job) -> Reference:
    """The job's one-process losses and their rounding floor (:func:`rounding_floor`)."""
    threads = torch.get_num_threads()
    losses = single_process_losses(job)[0]
    torch.set_num_threads(1 if threads > 1 else 2)
    try:
        twin = single_process_losses(job)[0]
    finally:
        torch.set_num_threads(threads)
    return Reference(losses, rounding_floor(losses, twin, atol=LOSS_ATOL))


def warm_up(state: Path, delay: float) -> None:
    """One short 4-worker job through a scheduler before any measured run: the first job
    of a fresh Ray instance pays its cold start (5-11 s here against 5-7 s later)."""
    client.up(state_dir=state, policy="fifo", interval_s=1.0)
    row = client.submit(make_job("warm-up", 5, Variant.SLEEP, delay), workers=(4, 4),
                        checkpoint_every=100_000).wait(timeout_s=900)
    client.down()
    if row.state is not JobState.DONE:
        raise SystemExit(f"the warm-up job ended {row.state.value}: {row.error}")


def run(policy: str, jobs: list[tuple[str, int, int, float]], variant: Variant, state: Path,
        delay: float, references: dict[str, Reference]) -> PolicyRun:
    """Submit ``jobs`` at their arrival seconds under ``policy``; their outcome."""
    client.up(state_dir=state, policy="fifo" if policy == "fair" else policy, interval_s=1.0)
    began = time.time()
    handles = []
    for name, size, steps, at in jobs:
        time.sleep(max(0.0, began + at - time.time()))
        handles.append(client.submit(make_job(name, steps, variant, delay),
                                     workers=workers_for(policy, size),
                                     checkpoint_every=100_000))
    rows = [h.wait(timeout_s=3600) for h in handles]
    client.down()
    outcomes = []
    for r in rows:
        done = r.state is JobState.DONE
        metrics = read_metrics(Path(r.run_dir) / "metrics.jsonl") if done else []
        losses = [m["loss"] for m in metrics]
        reference = references[r.name]
        diff = max_relative_difference(losses, reference.losses, atol=LOSS_ATOL)
        excess = worst_over_envelope(losses, reference.losses, reference.floor,
                                     rtol=LOSS_RTOL, factor=NOISE_FACTOR, atol=LOSS_ATOL)
        outcomes.append(JobOutcome(r.name, done, r.submitted, r.ended, excess <= 1.0))
        if not done or not metrics:
            print(f"  {policy:7s} {r.name:8s} {r.state.value}: {r.error[-500:]}", flush=True)
            continue
        first = metrics[0]["finished_at"] - metrics[0]["step_time_s"]
        print(f"  {policy:7s} {r.name:8s} JCT {r.ended - r.submitted:6.1f} s = queued "
              f"{r.started - r.submitted:5.1f} + start-up {first - r.started:5.1f} + training "
              f"{r.ended - first:5.1f}; resizes {r.restarts}; losses vs alone: max rel. diff "
              f"{diff:.1e} (reference's own drift {reference.floor[-1]:.1e}; worst step at "
              f"{excess:.2f} of its allowance)", flush=True)
    return policy_run(outcomes)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--delay", type=float, default=0.01, help="seconds per sample (sleep)")
    parser.add_argument("--scale", type=float, default=None, help="multiplies every job's steps")
    parser.add_argument("--orders", default=None, help=f"comma-separated of {list(ORDERS)}")
    parser.add_argument("--variants", default="sleep,compute")
    add_common_arguments(parser)
    args = parser.parse_args()
    scale = args.scale or (0.15 if args.quick else 1.0)
    orders = (args.orders or ("long-last" if args.quick else ",".join(ORDERS))).split(",")
    variants = [Variant(v) for v in args.variants.split(",")]
    start_ray("local", num_cpus=CLUSTER_WORKERS)
    runs: dict[tuple[Variant, str], dict[str, PolicyRun]] = {}
    verdict = Verdict(quick=args.quick)
    with tempfile.TemporaryDirectory() as tmp:
        warm_up(Path(tmp) / "warm-up", args.delay)
        index = 0
        for variant in variants:
            references = {name: reference_of(make_job(name, max(1, int(steps * scale)),
                                                      variant, 0.0))
                          for name, _, steps in JOBS}
            for order in orders:
                jobs = arrivals(ORDERS[order], scale)
                print(f"== {variant.value}-bound, {order}: {[j[0] for j in jobs]} ==", flush=True)
                results = {}
                for policy in order_of(POLICIES, index):
                    state = Path(tmp) / f"{variant.value}-{order}-{policy}"
                    results[policy] = run(policy, jobs, variant, state, args.delay, references)
                    print(f"  {policy}: avg JCT {results[policy].avg_jct:.1f} s, makespan "
                          f"{results[policy].makespan:.1f} s", flush=True)
                runs[variant, order] = results
                index += 1
    return report(runs, verdict)


def report(runs: dict[tuple[Variant, str], dict[str, PolicyRun]], verdict: Verdict) -> int:
    def ratios(keys, field: str, peer: str) -> Spread:  # type: ignore[no-untyped-def]
        ours = [getattr(runs[k]["unipar"], field) for k in keys]
        theirs = [getattr(runs[k][peer], field) for k in keys]
        return Spread.of(paired_ratios(ours, theirs))

    every = list(runs)
    for key, results in runs.items():
        print(f"{key[0].value:8s} {key[1]:12s} " + "  ".join(
            f"{p} {r.avg_jct:6.1f} s / {r.makespan:6.1f} s" for p, r in results.items()))
    verdict.check(all(not math.isnan(r.avg_jct) for res in runs.values() for r in res.values()),
                  "every job of every run ended DONE with the losses it has alone")
    jct = ratios(every, "avg_jct", "fifo")
    verdict.target("avg_jct_ratio", jct, 0.7)
    by_variant = {v: ratios([k for k in every if k[0] == v], "avg_jct", "fifo")
                  for v in (Variant.SLEEP, Variant.COMPUTE)}
    return verdict.finish({
        "avg_jct_ratio": jct,
        "makespan_ratio": ratios(every, "makespan", "fifo"),
        "avg_jct_ratio_sleep": by_variant[Variant.SLEEP],
        "avg_jct_ratio_compute": by_variant[Variant.COMPUTE],
        "avg_jct_vs_fair": ratios(every, "avg_jct", "fair"),
    })


if __name__ == "__main__":
    sys.exit(main())
