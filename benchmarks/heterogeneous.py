"""Uneven data-parallel shares on a measured heterogeneous cluster, in one invocation.

Every run is ``fit`` with a :class:`~unipar.plan.Plan` whose ``replica_samples`` give the
shares. Three workers pinned with ``os.sched_setaffinity`` (by the job's model factory,
from the worker's rank): two share core 0, one has core 1, so the third is about twice as
fast. Calibration runs (even split, traced: ``trace_steps``) measure each kind of worker's
seconds per sample from its micro-batches' forward and backward, with the kind to measure
as rank 0 (the traced rank), and the gradient all-reduce as the step's time beyond the
slowest compute; each configuration that is run is calibrated as it runs (on this machine
a worker runs faster while the other core is idle than while it is busy). The cluster they
make (one group per worker, its measured rate as its peak) goes to the heterogeneous
planner, whose uneven plan is then run beside the splits a user would try instead: even
over all three workers, even over the fast workers only (the one with a core of its own),
and even with one worker per core (one of the pair on core 0 left out).

Each round calibrates, plans, and runs every case (``STEPS`` timed steps after one warm-up
step; medians), the cases in an order rotated from round to round; ``--repeats`` rounds.
The ratios are taken within each round (a load burst in one round must not pair with a
quiet case of another), then their median and range over the rounds. Correctness: every
case trains the even split's per-step losses (the same global batch, split otherwise;
rtol ``LOSS_RTOL``).

Note: on this machine the uneven plan's best case (shares 1:1:2) equals an even split with
one worker per core; ``uneven_vs_one_per_core`` says how close it comes.

RESULT: uneven_vs_even (uneven / the better of even over all and fast only; target <= 0.8),
pred_err (the uneven plan's |predicted / measured - 1|, that plan alone), uneven_vs_fast_only,
uneven_vs_one_per_core; each with _min/_max over the rounds.

    python benchmarks/heterogeneous.py [--repeats 3] [--steps 20] [--quick]
"""

from __future__ import annotations

import argparse
import functools
import logging
import math
import os
import statistics
import sys
import tempfile
from collections import defaultdict
from dataclasses import dataclass, replace
from pathlib import Path

import ray
from measure import (
    Spread,
    Verdict,
    add_common_arguments,
    max_relative_difference,
    order_of,
    ratio,
    repeats_of,
)
from ray_head import wait_for_idle

from unipar import fit
from unipar.cluster.hetero import HeteroCluster, NodeGroup
from unipar.cluster.spec import ClusterSpec, DeviceSpec, LinkSpec, Precision
from unipar.job import Job
from unipar.models.mlp import MLP, MLPConfig
from unipar.optimizer import OptimizerSpec
from unipar.plan import Mesh, Plan
from unipar.plan.hetero import (
    HeteroKind,
    LayerProfile,
    plan_hetero,
    predict_data_parallel,
)
from unipar.runtime.tracing import TracedAction
from unipar.testing import RandomRegression, mse_loss

ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])

CONFIG = MLPConfig(in_features=256, hidden=256, layers=4, out_features=16, expansion=4)
# The global batch is large enough that compute outweighs the gradient all-reduce
# (~30 ms for this model's 2.1M parameters over gloo) about 20 to 1: the best uneven
# split can at most reach 0.75 of the best even one here (rates 1:1:2 per worker).
BATCH, MICRO = 6144, 32
STEPS = 20  # timed steps of every case (one more, unmeasured, before them)
CALIBRATION_STEPS = 4  # of each calibration run, the first untraced
CPUS = [[0], [0], [1]]  # each rank's cores: two workers share core 0, one has core 1
LOSS_RTOL = 1e-4
PLACEMENT_TIMEOUT_S = 300.0  # how long a run may wait for its workers to start
UNEVEN, EVEN, FAST, PER_CORE = ("uneven (planner)", "even, 3 workers", "even, fast only",
                                "even, one per core")


def _pinned_mlp(cpus: tuple[tuple[int, ...], ...]) -> MLP:
    """The model, built in a gang's worker pinned (all its threads) to its rank's cores
    ``cpus[rank]``; built anywhere else (the driver), nothing is pinned."""
    import torch.distributed as dist  # deferred: torch, needed in the worker only

    if ray.is_initialized() and ray.get_runtime_context().get_actor_id() is not None:
        rank = dist.get_rank() if dist.is_initialized() else 0
        for thread in os.listdir("/proc/self/task"):
            os.sched_setaffinity(int(thread), cpus[rank])
    return MLP(CONFIG)


def _job(steps: int, cpus: list[list[int]]) -> Job:
    return Job(
        name="hetero-mlp",
        model=functools.partial(_pinned_mlp, tuple(tuple(c) for c in cpus)),
        dataset=functools.partial(
            RandomRegression, 2 * BATCH, CONFIG.in_features, CONFIG.out_features
        ),
        loss=mse_loss,
        global_batch_size=BATCH,
        steps=steps,
        optimizer=OptimizerSpec(lr=1e-3),
    )


def _plan(samples: list[int]) -> Plan:
    """Data parallel with these per-replica shares (rank ``r`` takes ``samples[r]``)."""
    return Plan(
        mesh=Mesh(dp=len(samples)),
        microbatch_size=MICRO,
        num_microbatches=max(samples) // MICRO,
        replica_samples=tuple(samples),
    )


def _layers() -> tuple[LayerProfile, ...]:
    """Linear layers: 6 FLOPs per weight per sample (forward 2, backward 4)."""
    c, h = CONFIG, CONFIG.hidden
    shapes = [(c.in_features, h)] + [(h, 4 * h), (4 * h, h)] * c.layers + [(h, c.out_features)]
    return tuple(
        LayerProfile(flops=6 * i * o, params=i * o + o, activation_bytes=4 * o, output_bytes=4 * o)
        for i, o in shapes
    )


def _median(values: list[float]) -> float:
    """The median after the first (warm-up) value."""
    return statistics.median(values[1:])


def _cluster(sample_s: list[float], allreduce_s: float, cpus: list[list[int]]) -> HeteroCluster:
    flops = sum(layer.flops for layer in _layers())
    grad_bytes = 4 * sum(layer.params for layer in _layers())
    n = len(sample_s)
    bandwidth = 2 * (n - 1) / n * grad_bytes / allreduce_s if n > 1 else math.inf
    link = LinkSpec(bandwidth=bandwidth, latency_s=0.0)
    groups = []
    for i, s in enumerate(sample_s):
        device = DeviceSpec(
            name=f"worker{i}-cores{cpus[i]}",
            memory_gib=4,
            peak_flops_16bit=flops / s,
            peak_flops_32bit=flops / s,
            memory_bandwidth=1e10,
            gemm_efficiency=1.0,
            kernel_overhead_s=0.0,
            reserved_gib=0.0,
            precision=Precision.FP32,
        )
        groups.append(NodeGroup(f"w{i}", ClusterSpec(f"w{i}", 1, 1, device, link, link)))
    return HeteroCluster(tuple(groups), inter_group=link)


def _fit(samples: list[int], cpus: list[list[int]], steps: int, *, traced: bool = False):  # type: ignore[no-untyped-def]
    """``fit`` of the job for ``steps`` on ``len(samples)`` workers pinned to ``cpus`` with
    those shares (traced: its steps after the first), once the previous run's workers are
    gone (under load their processes take a while to exit)."""
    wait_for_idle(len(CPUS))
    with tempfile.TemporaryDirectory() as run_dir:
        return fit(
            _job(steps, cpus),
            workers=len(samples),
            plan=_plan(samples),
            cpus_per_worker=1,
            run_dir=Path(run_dir),
            checkpoint_every=10 * steps,
            progress=False,
            trace_steps=steps - 1 if traced else None,
            # a bound, not a measured time: at load 40 three workers took over 60 s to start
            placement_timeout_s=PLACEMENT_TIMEOUT_S,
        )


def _rank0_compute_s(result) -> list[float]:  # type: ignore[no-untyped-def]
    """Rank 0's forward and backward time in each traced step. The last micro-batch's
    backward also waits for the gradient all-reduce: the median of the others stands in."""
    spans: dict[int, dict[TracedAction, list[float]]] = defaultdict(lambda: defaultdict(list))
    for record in result.trace.records:
        if record.rank == 0 and record.action in (TracedAction.FORWARD, TracedAction.BACKWARD):
            spans[record.step][record.action].append((record.end_ns - record.start_ns) / 1e9)
    computed = []
    for step in sorted(spans):
        forward, backward = spans[step][TracedAction.FORWARD], spans[step][TracedAction.BACKWARD]
        computed.append(sum(forward) + sum(backward[:-1]) + statistics.median(backward[:-1]))
    return computed


def rank0_orders(cpus: list[list[int]]) -> list[list[list[int]]]:
    """The same workers rotated so that each kind of worker (each distinct set of cores)
    is rank 0, the traced rank, once: ``[[0], [0], [1]]`` gives itself and
    ``[[1], [0], [0]]``."""
    firsts = {tuple(c): k for k, c in reversed(list(enumerate(cpus)))}
    return [cpus[k:] + cpus[:k] for k in sorted(firsts.values())]


def _calibrate(even: list[int], cpus: list[list[int]]) -> HeteroCluster:
    """The cluster ``cpus`` make, measured with an even split: each kind of worker's
    seconds per sample (a run with it as the traced rank 0), and the step's time beyond
    the slowest compute as the all-reduce."""
    orders = rank0_orders(cpus)
    runs = [_fit(even, order, CALIBRATION_STEPS, traced=True) for order in orders]
    rate = {}  # cores -> seconds per sample
    for order, result in zip(orders, runs, strict=True):
        rate[tuple(order[0])] = statistics.median(_rank0_compute_s(result)) / even[0]
    sample_s = [rate[tuple(c)] for c in cpus]
    steps = [m.step_time_s for result in runs for m in result.history[1:]]
    allreduce_s = max(1e-4, statistics.median(steps) - max(sample_s) * even[0])
    print(f"measured on cores {cpus}: s/sample", [f"{s * 1e3:.2f} ms" for s in sample_s],
          f"all-reduce {allreduce_s * 1e3:.1f} ms", flush=True)
    return _cluster(sample_s, allreduce_s, cpus)


@dataclass(frozen=True)
class Case:
    """One split that is run: its shares and pinning, the time predicted for it, and once
    run its measured step time (median after the warm-up) and per-step losses."""

    shares: list[int]
    cpus: list[list[int]]
    predicted: float
    measured: float = math.nan
    losses: tuple[float, ...] = ()


def _run(case: Case, steps: int) -> Case:
    result = _fit(case.shares, case.cpus, steps + 1)
    return replace(case, measured=_median([m.step_time_s for m in result.history]),
                   losses=tuple(result.losses))


def _round(index: int, steps: int) -> dict[str, Case]:
    """Calibrate, plan, and run each case (in an order rotated by ``index``). The fast
    worker alone and one worker per core are calibrated as they run."""
    even = [BATCH // 3] * 3
    cluster = _calibrate(even, CPUS)
    alone = _calibrate([BATCH], [CPUS[2]])
    per_core = [CPUS[0], CPUS[2]]
    pair = _calibrate([BATCH // 2] * 2, per_core)
    layers = _layers()
    plan = plan_hetero(layers, cluster, BATCH, kinds=(HeteroKind.DATA_PARALLEL,),
                       microbatch_sizes=(MICRO,))
    m = BATCH // MICRO
    # workers the plan gives no samples are left out (HeteroPlan.to_plan)
    taking = [(n, c) for n, c in zip(plan.replica_samples, CPUS, strict=True) if n]
    cases = {
        UNEVEN: Case([n for n, _ in taking], [c for _, c in taking], plan.predicted_step_s),
        EVEN: Case(even, CPUS, predict_data_parallel(layers, cluster, ((m // 3,),) * 3, MICRO)),
        FAST: Case([BATCH], [CPUS[2]], predict_data_parallel(layers, alone, ((m,),), MICRO)),
        PER_CORE: Case([BATCH // 2] * 2, per_core,
                       predict_data_parallel(layers, pair, ((m // 2,),) * 2, MICRO)),
    }
    out = {}
    for name in order_of(list(cases), index):
        try:
            out[name] = _run(cases[name], steps)
        except Exception as error:  # a failed case is a missing figure, not a crash of the rest
            print(f"{name} FAILED: {type(error).__name__}: {error}", flush=True)
            out[name] = cases[name]
            continue
        print(f"{name:22s} shares={out[name].shares} measured {out[name].measured:.3f} s "
              f"predicted {out[name].predicted:.3f} s", flush=True)
    return out


# -- the arithmetic (pure) ---------------------------------------------------------------


def round_ratios(cases: dict[str, Case]) -> dict[str, float]:
    """One round's ratios: the uneven plan against the better of the even splits over
    the same workers and over the fast ones only, each alternative, and its own error."""
    uneven = cases[UNEVEN]
    best_even = min(cases[EVEN].measured, cases[FAST].measured)
    if math.isnan(cases[EVEN].measured) or math.isnan(cases[FAST].measured):
        best_even = math.nan  # a failed alternative: no "better of the two" to compare with
    return {
        "uneven_vs_even": ratio(uneven.measured, best_even),
        "pred_err": abs(ratio(uneven.predicted, uneven.measured) - 1),
        "uneven_vs_fast_only": ratio(uneven.measured, cases[FAST].measured),
        "uneven_vs_one_per_core": ratio(uneven.measured, cases[PER_CORE].measured),
    }


def loss_differences(cases: dict[str, Case]) -> dict[str, float]:
    """Each case's largest relative difference of its per-step losses from the even
    split's (``inf`` where a case has none: it failed)."""
    reference = cases[EVEN].losses
    return {name: max_relative_difference(c.losses, reference) for name, c in cases.items()}


def losses_check(cases: dict[str, Case]) -> float:
    """The largest of :func:`loss_differences`."""
    return max(loss_differences(cases).values())


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=None,
                        help=f"timed steps of every case (default {STEPS}; --quick: 4)")
    add_common_arguments(parser)
    args = parser.parse_args()
    rounds = repeats_of(args, quick=1)
    steps = args.steps or (4 if args.quick else STEPS)
    verdict = Verdict(quick=args.quick)
    ray.init(address="local", num_cpus=3, include_dashboard=False, logging_level=logging.WARNING)
    try:
        print(f"load average before: {os.getloadavg()}", flush=True)
        results = [_round(i, steps) for i in range(rounds)]
        print(f"load average after: {os.getloadavg()}")
    finally:
        ray.shutdown()
    figures = [round_ratios(r) for r in results]
    for name in figures[0]:
        print(f"{name} per round: {[round(f[name], 3) for f in figures]}")
    for i, r in enumerate(results):
        diffs = ", ".join(f"{name} {d:.1e}" for name, d in loss_differences(r).items())
        verdict.check(losses_check(r) <= LOSS_RTOL, f"round {i + 1}: every split trains the "
                      f"even split's losses (max rel. diff: {diffs})")
    values = {name: Spread.of([f[name] for f in figures]) for name in figures[0]}
    verdict.target("uneven_vs_even", values["uneven_vs_even"], 0.8)
    return verdict.finish({**values, "steps": steps})


if __name__ == "__main__":
    sys.exit(main())
