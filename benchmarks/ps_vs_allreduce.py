"""Parameter server vs all-reduce on a click-through-rate model, and stragglers.

Part 1: the CTR model (``--rows`` embedding rows, default 10M, width ``--dim``) trained by 2
workers at touched-row shares dense around the crossover (``--fractions``, 0.5% to 10% of
the rows a worker's batch touches per step), three ways on the same batches: (a) 2
parameter servers (rows pulled and pushed sparsely, BSP, SGD); (b) dense all-reduce (every
gradient, the table's included, then a local SGD step); (c) a sparse exchange: all-gather
of each worker's touched ids and gradient rows (benchmarks/ps_baselines.py). Each point: the
median of ``--steps`` (>= 10) timed steps after ``--warmup``; the sides alternate (the order
rotated each repeat) over ``--repeats``. The planner
(``unipar.plan.sync_cost.choose_grad_sync``) picks PS or all-reduce from link speeds and a
per-row cost calibrated on separate runs: another data seed, touched shares outside the
sweep (``--calibrate-at``), and, with ``--calibration FILE``, another invocation
(``--calibrate-only`` writes the file). Score: the time lost through the planner's pick,
pick / the faster of (a) and (b) - 1 per point, and pick / the fastest of all three - 1.
Correctness: after each point's steps, (a) and (c) hold the parameters (b) holds.

Part 2: stragglers, at ``--straggler-workers`` (8 and 4) sharing the same total worker-steps
under BSP, SSP (bound ``--staleness``) and ASP, one worker at a time 2x slower (it sleeps as
long again as its own work took; waits in pulls left out): rotating (the slow worker changes
every ``--rotate-every`` clocks, what SSP is for) and persistent (always the last worker).
Throughput = worker-steps/s; final loss on held-out batches. With ``n`` workers a rotating
straggler caps BSP at one slow step per clock, ``2t``, while SSP runs each worker at its mean
``(1 + 1/n) t``: an ideal gain of ``2 / (1 + 1/n)``, 1.78 for 8 workers and 1.6 for 4.
SSP's lead is bounded by ``s`` under a persistent straggler (a small long-run gain by
design); ASP's ideal there is ``2 - 1/n``.

RESULT (``--calibrate-only``: row_ns, all_reduce_mb_s, actor_mb_s, actor_call_ms):
time_lost, time_lost_vs_sparse, planner_right (share of points where the pick was the
faster of (a) and (b)), straggler_speedup (SSP/BSP, rotating, 8 workers; target >= 1.6),
straggler_speedup_4, loss_gap (SSP vs BSP held-out, 8 workers), persistent_ssp_speedup,
persistent_asp_speedup, persistent_asp_loss_gap, their _4 forms, ideal_8, ideal_4; each
timed ratio with _min/_max over the repeats.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import logging
import os
import statistics
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import torch
from measure import Spread, Verdict, add_common_arguments, order_of, ratio, repeats_of
from ps_baselines import (
    FIELDS,
    LR,
    CollectiveWorker,
    UniformClicks,
    calibrate_links,
    max_param_difference,
)
from ray_head import free_port

from unipar.models.ctr import CTRModel, ZipfClicks, ctr_loss
from unipar.optimizer import OptimizerKind, OptimizerSpec
from unipar.plan.representation import GradSync
from unipar.plan.sync_cost import Links, SparseWorkload, choose_grad_sync, price_ps
from unipar.ps import Consistency, ConsistencySpec
from unipar.runtime.servers.train import PSConfig, PSRun, Slowdown

PARAM_ATOL = 1e-4  # the three sides' parameters after the same steps
SIDES = ("ps", "dense", "sparse")

# -- the arithmetic (pure) ---------------------------------------------------------------


def pick_time(pick: GradSync, times: dict[str, float]) -> float:
    return times["ps"] if pick is GradSync.PARAMETER_SERVER else times["dense"]


def time_lost(pick: GradSync, times: dict[str, float], among: Sequence[str]) -> float:
    """What the planner's pick cost at one point: its time over the fastest of ``among``,
    less 1 (0: it picked the fastest); NaN where a time is missing."""
    best = min(times[s] for s in among)
    return ratio(pick_time(pick, times), best) - 1.0


def mean_time_lost(points: Sequence[tuple[GradSync, dict[str, float]]], among: Sequence[str]
                   ) -> float:
    """The mean over the sweep's points of :func:`time_lost` (each point counts alike)."""
    lost = [time_lost(pick, times, among) for pick, times in points]
    return statistics.fmean(lost) if lost else float("nan")


def ideal_speedup(workers: int) -> float:
    """SSP over BSP with one worker in ``workers`` 2x slower at a time, rotating."""
    return 2.0 / (1.0 + 1.0 / workers)


# -- part 1: the sweep -------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class PSPoint:
    """One PS measurement: the median step time, what the cost model needs, the params."""

    step_s: float
    bytes_per_worker: float
    workload: SparseWorkload
    params: dict[str, torch.Tensor]


def measure_ps(args, fraction: float, timed_steps: int, seed: int = 0) -> PSPoint:
    """2 workers, 2 servers, BSP, SGD: the median step over ``timed_steps`` after warm-up;
    the compute of one worker's forward/backward alone (the pulled rows as its table) goes
    to the cost model."""
    touched = max(int(fraction * args.rows), FIELDS)
    data = UniformClicks(args.rows, touched, seed)
    steps = args.warmup + timed_steps
    factory = functools.partial(CTRModel, args.rows, args.dim, FIELDS, seed=0)
    config = PSConfig(num_servers=2, optimizer=OptimizerSpec(OptimizerKind.SGD, lr=LR))
    ps = PSRun(factory, data, ctr_loss, workers=2, steps=steps, config=config).result()
    ps_s = statistics.median(t for times in ps.step_s for t in times[args.warmup :])
    ids, clicks = data(0, 1)
    unique, local = torch.unique(ids, return_inverse=True)
    small = CTRModel(len(unique), args.dim, FIELDS, seed=0)
    began = time.perf_counter()
    for _ in range(3):
        small.zero_grad()
        ctr_loss(small, (local, clicks)).backward()
    compute = (time.perf_counter() - began) / 3
    dense = sum(p.numel() for n, p in small.named_parameters() if not n.startswith("embedding"))
    workload = SparseWorkload(table_rows=args.rows, dim=args.dim, dense_params=dense,
                              touched_fraction=len(unique) / args.rows, workers=2, servers=2,
                              serve_dense=True, compute_s=compute)
    return PSPoint(ps_s, (ps.bytes_pulled + ps.bytes_pushed) / (2 * steps), workload, ps.params)


def calibrate(ray, args, workers) -> Links:  # type: ignore[no-untyped-def]
    """Link speeds, then the per-row cost of the PS path: PS runs (data seed 1, not the
    sweep's 0) at the two touched shares of ``--calibrate-at`` (outside the sweep); the
    growth of the measured step beyond what the model prices without rows, per extra row."""
    links = calibrate_links(ray, workers, args.rows, args.dim)
    low, high = (measure_ps(args, float(f), args.calibrate_steps, seed=1)
                 for f in args.calibrate_at.split(","))
    measured = high.step_s - low.step_s
    priced = price_ps(high.workload, links).step_s - price_ps(low.workload, links).step_s
    rows = (high.workload.touched_fraction - low.workload.touched_fraction) * args.rows
    row_s = max(measured - priced, 0.0) / rows
    print(f"row cost: {row_s * 1e9:.0f} ns per touched row (+{rows:,.0f} rows: step "
          f"+{measured * 1e3:.1f} ms, of which +{priced * 1e3:.1f} ms priced without rows)",
          flush=True)
    return dataclasses.replace(links, row_s=row_s)


def links_for(ray, args, workers) -> Links:  # type: ignore[no-untyped-def]
    path = Path(args.calibration) if args.calibration else None
    if path is not None and path.is_file() and not args.calibrate_only:
        print(f"links from {path} (calibrated in another invocation)", flush=True)
        return Links(**json.loads(path.read_text()))
    links = calibrate(ray, args, workers)
    if path is not None:
        path.write_text(json.dumps(dataclasses.asdict(links), indent=1))
        print(f"links written to {path}", flush=True)
    return links


def sweep_point(ray, args, workers, fraction: float, repeat: int) -> dict:  # type: ignore[no-untyped-def]
    """The three sides at one touched share, in the order of ``repeat``: median step times,
    bytes, and each side's parameters' largest difference from the dense side's."""
    data = UniformClicks(args.rows, max(int(fraction * args.rows), FIELDS))
    steps = args.warmup + args.steps
    times, states, ps = {}, {}, None
    for side in order_of(SIDES, repeat):
        if side == "ps":
            ps = measure_ps(args, fraction, args.steps)
            times["ps"], states["ps"] = ps.step_s, ps.params
        else:
            runs = ray.get([w.run.remote(data, steps, side == "sparse") for w in workers])
            times[side] = statistics.median(t for run in runs for t in run[args.warmup :])
            states[side] = ray.get(workers[0].state.remote())
    assert ps is not None
    return {"times": times, "workload": ps.workload, "ps_bytes": ps.bytes_per_worker,
            "diff": {s: max_param_difference(states[s], states["dense"]) for s in ("ps", "sparse")}}


def sweep(ray, args, links: Links, workers, repeats: int) -> tuple[dict, Verdict]:  # type: ignore[no-untyped-def]
    fractions = [float(f) for f in args.fractions.split(",") if f]
    per_repeat: list[list[dict]] = []
    for repeat in range(repeats):
        per_repeat.append([sweep_point(ray, args, workers, f, repeat) for f in fractions])
        print(f"sweep repeat {repeat + 1}/{repeats} done", flush=True)
    print(f"{'touched':>9} {'PS ms':>8} {'dense ms':>9} {'sparse ms':>10} {'PS pred':>8} "
          f"{'AR pred':>8} {'PS MiB':>8} {'AR MiB':>8} pick")
    points, lost, lost_all, right, worst = [], [], [], [], 0.0
    for i, fraction in enumerate(fractions):
        runs = [r[i] for r in per_repeat]
        times = {s: statistics.median(r["times"][s] for r in runs) for s in SIDES}
        choice = choose_grad_sync(runs[0]["workload"], links)
        points.append((choice.kind, times))
        worst = max([worst, *(d for r in runs for d in r["diff"].values())])
        faster = min(("ps", "dense"), key=lambda s: times[s])
        right.append(pick_time(choice.kind, times) == times[faster])
        print(f"{fraction:>9.2%} {times['ps'] * 1e3:>8.1f} {times['dense'] * 1e3:>9.1f} "
              f"{times['sparse'] * 1e3:>10.1f} {choice.ps.step_s * 1e3:>8.1f} "
              f"{choice.all_reduce.step_s * 1e3:>8.1f} {runs[0]['ps_bytes'] / 2**20:>8.2f} "
              f"{choice.all_reduce.bytes_per_worker / 2**20:>8.2f} {choice.reason}", flush=True)
    for r in per_repeat:  # the score of each repeat's own times: its spread
        repeat_points = [(kind, r[i]["times"]) for i, (kind, _) in enumerate(points)]
        lost.append(mean_time_lost(repeat_points, ("ps", "dense")))
        lost_all.append(mean_time_lost(repeat_points, SIDES))
    verdict = Verdict(quick=args.quick)
    verdict.check(worst <= PARAM_ATOL, f"PS and the sparse exchange end with the dense "
                  f"all-reduce's parameters at every point (max |diff| {worst:.1e})")
    return {"time_lost": Spread.of(lost), "time_lost_vs_sparse": Spread.of(lost_all),
            "planner_right": sum(right) / max(len(right), 1)}, verdict


# -- part 2: stragglers ------------------------------------------------------------------


def heldout_loss(params: dict[str, torch.Tensor], data: ZipfClicks, args) -> float:
    model = CTRModel(args.straggler_rows, args.dim, FIELDS)
    model.load_state_dict(params)
    with torch.no_grad():
        return statistics.fmean(float(ctr_loss(model, data(10_000, c))) for c in range(1, 41))


@dataclasses.dataclass(frozen=True)
class OnDevice:
    """The CTR loss, then ``seconds`` of simulated accelerator time (the forward and
    backward passes of a worker with a device of its own: 2 cores cannot run 8 workers'
    real work side by side). It falls between the pull and the push, as real compute does."""

    seconds: float

    def __call__(self, model: torch.nn.Module, batch: tuple) -> torch.Tensor:
        loss = ctr_loss(model, batch)
        time.sleep(self.seconds)
        return loss


def straggler_run(args, workers: int, spec: ConsistencySpec, slowdown: Slowdown
                  ) -> tuple[float, float]:
    """``workers`` sharing ``--straggler-steps`` worker-steps each: (worker-steps/s,
    held-out loss)."""
    data = ZipfClicks(args.straggler_rows, batch=256, fields=FIELDS)
    factory = functools.partial(CTRModel, args.straggler_rows, args.dim, FIELDS, seed=0)
    config = PSConfig(num_servers=2, optimizer=OptimizerSpec(OptimizerKind.ADAGRAD, lr=LR),
                      consistency=spec)
    result = PSRun(factory, data, OnDevice(args.compute), workers=workers,
                   steps=args.straggler_steps, config=config, slowdown=slowdown,
                   shared_budget=True).result()
    rate, loss = result.steps / result.wall_s, heldout_loss(result.params, data, args)
    print(f"  {workers} workers {spec.mode.value}: {rate:.1f} worker-steps/s, held-out loss "
          f"{loss:.4f}", flush=True)
    return rate, loss


def stragglers(args, workers: int, repeats: int) -> dict[str, Spread | float]:
    """BSP, SSP and ASP, each kind of straggler, alternated over ``repeats``; the ratios
    to BSP of each repeat."""
    specs = {Consistency.BSP: ConsistencySpec(),
             Consistency.SSP: ConsistencySpec(Consistency.SSP, args.staleness),
             Consistency.ASP: ConsistencySpec(Consistency.ASP)}
    kinds = {"rotating": Slowdown(2.0, rotate_every=args.rotate_every),
             "persistent": Slowdown(2.0, worker=workers - 1)}
    out: dict[tuple[str, Consistency], list[tuple[float, float]]] = {}
    for repeat in range(repeats):
        for kind, slowdown in kinds.items():
            print(f"straggler, {workers} workers, {kind}, repeat {repeat + 1}: {slowdown}",
                  flush=True)
            for mode in order_of(list(specs), repeat):
                out.setdefault((kind, mode), []).append(
                    straggler_run(args, workers, specs[mode], slowdown))

    def speedup(kind: str, mode: Consistency) -> Spread:
        return Spread.of([ratio(r, b) for (r, _), (b, _) in
                          zip(out[kind, mode], out[kind, Consistency.BSP], strict=True)])

    def loss_gap(kind: str, mode: Consistency) -> Spread:
        return Spread.of([(loss - base) / base for (_, loss), (_, base) in
                          zip(out[kind, mode], out[kind, Consistency.BSP], strict=True)])

    return {"speedup": speedup("rotating", Consistency.SSP),
            "loss_gap": loss_gap("rotating", Consistency.SSP),
            "persistent_ssp": speedup("persistent", Consistency.SSP),
            "persistent_asp": speedup("persistent", Consistency.ASP),
            "persistent_asp_gap": loss_gap("persistent", Consistency.ASP),
            "ideal": ideal_speedup(workers)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=None)
    parser.add_argument("--dim", type=int, default=4)
    parser.add_argument("--fractions", default=None)
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--steps", type=int, default=10, help="timed steps a point (>= 10)")
    parser.add_argument("--calibrate-at", default="0.002,0.2",
                        help="two touched shares (outside the sweep) timed for the row cost")
    parser.add_argument("--calibrate-steps", type=int, default=10)
    parser.add_argument("--calibration", default=None,
                        help="links JSON: read if it exists (else calibrate and write it)")
    parser.add_argument("--calibrate-only", action="store_true",
                        help="calibrate, write --calibration, and stop")
    parser.add_argument("--straggler-rows", type=int, default=100_000)
    parser.add_argument("--straggler-steps", type=int, default=None)
    parser.add_argument("--straggler-workers", default="8,4")
    parser.add_argument("--staleness", type=int, default=4)
    parser.add_argument("--rotate-every", type=int, default=2, help="clocks per rotating straggler")
    parser.add_argument("--compute", type=float, default=0.1,
                        help="s of simulated device time per step")
    add_common_arguments(parser)
    args = parser.parse_args()
    repeats = repeats_of(args, quick=1)
    args.rows = args.rows or (1_000_000 if args.quick else 10_000_000)
    args.fractions = args.fractions or ("0.005,0.05" if args.quick else
                                        "0.005,0.01,0.02,0.03,0.05,0.07,0.1")
    args.straggler_steps = args.straggler_steps or (12 if args.quick else 40)
    if args.calibrate_only and not args.calibration:
        raise SystemExit("--calibrate-only needs --calibration FILE to write the links to")
    import ray

    ray.init(address="local", num_cpus=4, include_dashboard=False, logging_level=logging.WARNING)
    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])
    port = free_port()
    actor = ray.remote(CollectiveWorker).options(num_cpus=0)
    workers = [actor.remote(r, 2, port, args.rows, args.dim) for r in range(2)]
    links = links_for(ray, args, workers)
    print(f"links: {links}", flush=True)
    if args.calibrate_only:
        ray.shutdown()
        return Verdict(quick=args.quick).finish({
            "row_ns": links.row_s * 1e9, "all_reduce_mb_s": links.all_reduce_bw / 1e6,
            "actor_mb_s": links.worker_bw / 1e6, "actor_call_ms": links.ps_latency_s * 1e3})
    scores, verdict = sweep(ray, args, links, workers, repeats)
    for w in workers:
        ray.kill(w)
    straggler = {int(n): stragglers(args, int(n), repeats)
                 for n in args.straggler_workers.split(",")}
    print(f"load average: {os.getloadavg()}")
    ray.shutdown()
    values: dict[str, Spread | float] = dict(scores)
    for n, figures in straggler.items():
        tail = "" if n == 8 else f"_{n}"
        values |= {f"straggler_speedup{tail}": figures["speedup"],
                   f"loss_gap{tail}": figures["loss_gap"],
                   f"persistent_ssp_speedup{tail}": figures["persistent_ssp"],
                   f"persistent_asp_speedup{tail}": figures["persistent_asp"],
                   f"persistent_asp_loss_gap{tail}": figures["persistent_asp_gap"],
                   f"ideal_{n}": figures["ideal"]}
    if "straggler_speedup" in values:
        verdict.target("straggler_speedup", values["straggler_speedup"], 1.6, at_most=False)
    return verdict.finish(values)


if __name__ == "__main__":
    sys.exit(main())
