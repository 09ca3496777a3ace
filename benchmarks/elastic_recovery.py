"""Recovery from a lost worker: unipar elastic against Ray Train (fixed size and elastic),
under data parallel, FSDP and a hybrid plan; and the cost of in-memory snapshots.

The scenario: an MLP (batch 256, checkpoints every 5 steps) whose last data replica is
SIGKILLed right after step 22 (the process kills itself when it reads the first sample of
its share of step 23, so every side is killed at the same point of the same work). One
invocation, one Ray cluster of 4 logical CPUs (``ray start --head``: benchmarks/ray_head.py),
sides alternated (the order rotated each repeat) over ``--repeats``:

- unipar elastic, ``fit(job, workers=(1, N))``: survivors go on from memory (DDP: a
  survivor holds the whole state; FSDP and the hybrid plan: the newest in-memory snapshot,
  the steps since redone), and the gang grows back to N once the freed CPU holds a worker;
  under DDP (2 workers), FSDP (2 workers) and HSDP (dp=2 x fsdp=2, 4 workers);
- unipar restart, ``fit(job, workers=2, elastic=False)``: the gang restarts from disk (DDP);
- Ray Train ``TorchTrainer`` with ``FailureConfig(max_failures=3)``, a checkpoint reported
  every 5 steps and resumed from ``ray.train.get_checkpoint()``: fixed size
  (``ScalingConfig(num_workers=2)``) and Ray Train V2's elastic mode
  (``ScalingConfig(num_workers=(1, 2))``, its resize check every second as unipar's); DDP.

Per side: seconds from the kill to the next completed step; committed steps redone; and
seconds from the kill until the job is back at full size and at its pre-kill speed (the
median interval of ``WINDOW`` consecutive steps at full size within 10% of the median
interval before the kill). Snapshot cost: the MLP under FSDP with the default adaptive
snapshots and with none, alternated; the share of the run's time spent outside steps beyond
the run's own typical gap (where snapshots happen: timed directly from the step records),
beside the A/B rate ratio.

RESULT: recovery_ratio (unipar elastic DDP / the faster Ray Train mode of each repeat, kill
to next step; target <= 0.15), recovery_vs_fixed, recovery_vs_elastic, full_rate_ratio (the
same for back at full speed), steps_lost (DDP), steps_lost_fsdp, steps_lost_hsdp,
next_step_fsdp_s, next_step_hsdp_s, full_rate_fsdp_s, full_rate_hsdp_s, snapshot_share
(target <= 0.03), snapshot_overhead (1 - with/without, A/B); each timed ratio with
_min/_max over the repeats.
"""

from __future__ import annotations

import argparse
import functools
import itertools
import json
import math
import os
import signal
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import ray
import torch
from measure import (
    Spread,
    Verdict,
    add_common_arguments,
    alternate,
    overhead,
    paired_ratios,
    repeats_of,
)
from ray_head import ray_head, wait_for_idle

from unipar import fit
from unipar.data.sampler import GlobalBatchSampler
from unipar.job import Job, OptimizerSpec
from unipar.models.mlp import MLP, MLPConfig
from unipar.plan import Plan
from unipar.plan.representation import Mesh
from unipar.ray_cluster.session import start_ray
from unipar.testing import RandomRegression, mse_loss

KILL_AFTER = 22
EVERY = 5
BATCH = 256
DATASET = 32 * BATCH
SEED = 0
WARMUP = 5  # steps before the pre-kill speed is measured
CLUSTER_CPUS = 4
TOLERANCE = 0.10  # "back at speed": the median interval within 10% of the pre-kill one
WINDOW = 5  # ... over this many consecutive steps at full size
MODEL = MLPConfig(in_features=64, hidden=256, layers=4, out_features=8)

# The plans unipar is killed under: (name, plan, workers).
PLANS = {
    "ddp": (Plan.data_parallel(2, BATCH), 2),
    "fsdp": (Plan(mesh=Mesh(fsdp=2), microbatch_size=BATCH // 2), 2),
    "hsdp": (Plan(mesh=Mesh(dp=2, fsdp=2), microbatch_size=BATCH // 4), 4),
}


# -- the arithmetic (pure) ---------------------------------------------------------------


@dataclass(frozen=True)
class StepEnd:
    """A completed step: its number, wall-clock end, and the workers that ran it."""

    step: int
    end: float
    world: int


@dataclass(frozen=True)
class Recovery:
    next_step_s: float  # kill -> the next completed step (inf: none came)
    redone: int  # committed steps (<= KILL_AFTER) completed again
    full_rate_s: float  # kill -> back at full size and pre-kill speed (inf: never)


def recovery(
    ends: Sequence[StepEnd],
    killed_at: float,
    *,
    full: int,
    kill_after: int = KILL_AFTER,
    warmup: int = WARMUP,
    window: int = WINDOW,
    tolerance: float = TOLERANCE,
) -> Recovery:
    """What the kill cost, from the completed steps in time order.

    Steps up to ``kill_after`` were committed before the kill (a survivor may log the end
    of one a moment after its peer died): only a second completion of one of them, or a
    later step, counts as a step after the kill. The pre-kill speed is the median interval
    between the first completions of steps ``warmup..kill_after``; the job is back at
    speed at the first completion after the kill from which ``window`` intervals between
    completions at ``full`` workers have a median within ``tolerance`` of it (the time is
    that completion's: the gang was then running at full size at full speed)."""
    ordered = sorted(ends, key=lambda e: e.end)
    seen: set[int] = set()
    after: list[StepEnd] = []
    redone: set[int] = set()
    before: list[float] = []
    for e in ordered:
        if e.step > kill_after or e.step in seen:
            after.append(e)
            if e.step in seen:
                redone.add(e.step)
        elif e.step >= warmup:
            before.append(e.end)
        seen.add(e.step)
    if not after:
        return Recovery(math.inf, len(redone), math.inf)
    next_step = after[0].end - killed_at
    gaps = [b - a for a, b in itertools.pairwise(before)]
    if not gaps:
        return Recovery(next_step, len(redone), math.nan)
    limit = statistics.median(gaps) * (1 + tolerance)
    for i in range(1, len(after) - window + 1):
        span = after[i - 1 : i + window]  # window intervals, all between full-size steps
        if any(e.world != full for e in span):
            continue
        intervals = [b.end - a.end for a, b in itertools.pairwise(span)]
        if statistics.median(intervals) <= limit:
            return Recovery(next_step, len(redone), span[0].end - killed_at)
    return Recovery(next_step, len(redone), math.inf)


def ends_from_metrics(lines: Sequence[str], start_world: int) -> list[StepEnd]:
    """The step ends of a unipar metrics file (one JSON object a line, in the order
    written), each with the gang size its resize events give."""
    world, out = start_world, []
    for line in lines:
        record = json.loads(line)
        if record.get("event") == "resize":
            world = int(record["new"])
        elif "event" not in record:
            out.append(StepEnd(int(record["step"]), float(record["finished_at"]), world))
    return out


@dataclass(frozen=True)
class SteadyRun:
    steps_per_s: float
    outside_steps_share: float  # time between steps beyond the typical gap / run time


def steady_run(records: Sequence[tuple[float, float]], warmup: int) -> SteadyRun:
    """Speed and time between steps of a run, from ``(finished_at, step_time_s)`` per step
    in order. Each gap is the time from one step's end to the next one's start (its end
    less its duration): where a snapshot, a checkpoint or a pause happens. The share is
    the sum of the gaps beyond the run's median gap over the run's time (from the start of
    the first step after ``warmup`` to the last end): what the in-memory snapshots cost,
    timed directly (never below 0; the same figure of a run without snapshots is the noise
    floor)."""
    kept = list(records)[warmup:]
    if len(kept) < 3:
        return SteadyRun(math.nan, math.nan)
    ends = [end for end, _ in kept]
    gaps = [(end - seconds) - before for (end, seconds), before in zip(kept[1:], ends,
                                                                      strict=False)]
    typical = statistics.median(gaps)
    excess = sum(max(0.0, g - typical) for g in gaps)
    began = kept[0][0] - kept[0][1]
    elapsed = ends[-1] - began
    return SteadyRun((len(ends) - 1) / (ends[-1] - ends[0]), excess / elapsed)


# -- the job ---------------------------------------------------------------------------


class KillingRegression(RandomRegression):
    """Regression data whose sample ``trigger`` kills the reading process, once (the
    time of the kill is written to ``marker`` first)."""

    def __init__(self, trigger: int, marker: str) -> None:
        super().__init__(DATASET, MODEL.in_features, MODEL.out_features)
        self.trigger, self.marker = trigger, marker

    def __getitem__(self, index: int):  # type: ignore[no-untyped-def]
        if index == self.trigger and not os.path.exists(self.marker):
            Path(self.marker).write_text(repr(time.time()))
            os.kill(os.getpid(), signal.SIGKILL)
        return super().__getitem__(index)


def trigger(replicas: int) -> int:
    """The first sample of the last replica's share of step KILL_AFTER + 1."""
    sampler = GlobalBatchSampler(DATASET, BATCH, SEED)
    return int(sampler.shard_indices(KILL_AFTER + 1, replicas - 1, replicas)[0])


def make_job(steps: int, marker: str, replicas: int = 2) -> Job:
    return Job(
        name="elastic-recovery",
        model=functools.partial(MLP, MODEL),
        dataset=functools.partial(KillingRegression, trigger(replicas), marker),
        global_batch_size=BATCH,
        steps=steps,
        optimizer=OptimizerSpec(lr=1e-3),
        loss=mse_loss,
        seed=SEED,
    )


# -- the sides ---------------------------------------------------------------------------


def run_unipar(tmp: Path, steps: int, plan_name: str, *, elastic: bool) -> Recovery:
    plan, workers = PLANS[plan_name]
    marker = tmp / "killed"
    result = fit(
        make_job(steps, str(marker), plan.mesh.data_replicas),
        workers=(1, workers) if elastic else workers,
        elastic=elastic,
        plan=plan,
        run_dir=tmp / "run",
        checkpoint_every=EVERY,
        progress=False,
    )
    for event in result.resizes:
        print(f"    resize {event} ({event.seconds:.2f} s to re-form)", flush=True)
    if elastic and (not result.resizes or result.resizes[0].old != workers):
        raise RuntimeError(f"the gang was not at {workers} workers when the worker was killed "
                           f"(resizes: {[str(e) for e in result.resizes]}): not this scenario")
    ends = ends_from_metrics(result.metrics_path.read_text().splitlines(), workers)
    return recovery(ends, float(marker.read_text()), full=workers)


def _ray_train_loop(config: dict) -> None:  # type: ignore[type-arg]
    import ray.train
    import ray.train.torch
    from torch.utils.data import default_collate

    context = ray.train.get_context()
    rank, world = context.get_world_rank(), context.get_world_size()
    job = make_job(config["steps"], config["marker"])
    torch.manual_seed(SEED)
    model = ray.train.torch.prepare_model(job.model())
    inner = getattr(model, "module", model)  # one worker: not wrapped in DDP
    optimizer = job.build_optimizer(model.parameters())
    start = 0
    checkpoint = ray.train.get_checkpoint()
    if checkpoint:
        with checkpoint.as_directory() as directory:
            state = torch.load(Path(directory) / "state.pt", weights_only=False)
        inner.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        start = state["step"]
    dataset = job.dataset()
    sampler = GlobalBatchSampler(DATASET, BATCH, SEED)
    for step in range(start, config["steps"]):
        inputs, targets = default_collate(
            [dataset[int(i)] for i in sampler.shard_indices(step, rank, world)]
        )
        loss = job.loss(model(inputs), targets)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        done = step + 1
        if rank == 0:
            with open(config["log"], "a") as log:
                log.write(f"{step} {time.time()} {world}\n")
        if done % EVERY == 0:
            with tempfile.TemporaryDirectory() as directory:
                saved = None
                if rank == 0:
                    state = {"model": inner.state_dict(), "optimizer": optimizer.state_dict(),
                             "step": done}
                    torch.save(state, Path(directory) / "state.pt")
                    saved = ray.train.Checkpoint.from_directory(directory)
                ray.train.report({"step": done}, checkpoint=saved)


def run_ray_train(tmp: Path, steps: int, *, elastic: bool) -> Recovery:
    from ray.train import FailureConfig, RunConfig, ScalingConfig
    from ray.train.torch import TorchTrainer

    marker, log = tmp / "killed", tmp / "steps.log"
    # Ray Train V2 (the default in Ray 2.60): a tuple is its elastic mode; its resize check
    # runs every second, as unipar's controller looks for room
    scaling = (
        ScalingConfig(num_workers=(1, 2), elastic_resize_monitor_interval_s=1.0)
        if elastic
        else ScalingConfig(num_workers=2)
    )
    trainer = TorchTrainer(
        _ray_train_loop,
        train_loop_config={"marker": str(marker), "log": str(log), "steps": steps},
        scaling_config=scaling,
        run_config=RunConfig(
            storage_path=str(tmp / "ray_train"), failure_config=FailureConfig(max_failures=3)
        ),
    )
    trainer.fit()
    ends = [StepEnd(int(s), float(t), int(w))
            for s, t, w in (line.split() for line in log.read_text().splitlines())]
    if ends[0].world != 2:
        raise RuntimeError(f"Ray Train started {ends[0].world} workers, not 2: not this scenario")
    return recovery(ends, float(marker.read_text()), full=2)


def steady(tmp: Path, steps: int, warmup: int, snapshots: bool) -> SteadyRun:
    """The MLP under FSDP (sharded state: the case that needs snapshots) with the default
    adaptive snapshots or none. The kill marker exists beforehand: no worker is killed."""
    marker = tmp / "already-killed"
    marker.touch()
    plan, workers = PLANS["fsdp"]
    result = fit(
        make_job(steps, str(marker)),
        workers=workers,
        plan=plan,
        run_dir=tmp / f"steady-{snapshots}-{time.monotonic_ns()}",
        checkpoint_every=10**9,
        progress=False,
        snapshot_every=None if snapshots else 0,
    )
    return steady_run([(m.finished_at, m.step_time_s) for m in result.history], warmup)


def in_tmp(run):  # type: ignore[no-untyped-def]
    """``run(tmp)`` in a fresh temporary directory, on an idle cluster."""

    def side():  # type: ignore[no-untyped-def]
        wait_for_idle(CLUSTER_CPUS)
        with tempfile.TemporaryDirectory() as tmp:
            result = run(Path(tmp))
        print(f"    -> {result}", flush=True)
        return result

    return side


# -- the report ----------------------------------------------------------------------------


def field_of(results: Sequence[Recovery | None], name: str) -> list[float | None]:
    return [None if r is None else getattr(r, name) for r in results]


def faster_peer(fixed: Sequence[float | None], elastic: Sequence[float | None]
                ) -> list[float | None]:
    """Per repeat, the faster of Ray Train's two modes (a failed mode leaves the other)."""
    out: list[float | None] = []
    for a, b in zip(fixed, elastic, strict=True):
        times = [t for t in (a, b) if t is not None and not math.isnan(t)]
        out.append(min(times) if times else None)
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=None, help="steps of each killed run")
    parser.add_argument("--steady-steps", type=int, default=None)
    parser.add_argument("--warmup", type=int, default=10)
    add_common_arguments(parser)
    args = parser.parse_args()
    repeats = repeats_of(args, quick=1)
    steps = args.steps or (60 if args.quick else 200)
    steady_steps = args.steady_steps or (40 if args.quick else 150)
    with ray_head(num_cpus=CLUSTER_CPUS) as address:
        start_ray(address)
        ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])
        runs, steady_runs = measure(args, repeats, steps, steady_steps)
        ray.shutdown()
    return report(runs, steady_runs, quick=args.quick)


def measure(args, repeats: int, steps: int, steady_steps: int):  # type: ignore[no-untyped-def]
    """Every side ``repeats`` times, alternated; then the steady runs, alternated."""

    def unipar_side(plan_name: str, elastic: bool):  # type: ignore[no-untyped-def]
        return in_tmp(lambda tmp: run_unipar(tmp, steps, plan_name, elastic=elastic))

    sides = {
        "unipar elastic ddp": unipar_side("ddp", True),
        "ray train": in_tmp(lambda tmp: run_ray_train(tmp, steps, elastic=False)),
        "unipar elastic fsdp": unipar_side("fsdp", True),
        "ray train elastic": in_tmp(lambda tmp: run_ray_train(tmp, steps, elastic=True)),
        "unipar elastic hsdp": unipar_side("hsdp", True),
        "unipar restart ddp": unipar_side("ddp", False),
    }
    runs = alternate(sides, repeats, log=lambda line: print(line, flush=True))
    with tempfile.TemporaryDirectory() as tmp:
        steady_runs = alternate(
            {
                "snapshots": lambda: steady(Path(tmp), steady_steps, args.warmup, True),
                "none": lambda: steady(Path(tmp), steady_steps, args.warmup, False),
            },
            repeats,
            log=lambda line: print(line, flush=True),
        )
    return runs, steady_runs


def report(runs: dict[str, list[Recovery | None]], steady_runs: dict[str, list[SteadyRun | None]],
           *, quick: bool) -> int:
    verdict = Verdict(quick=quick)
    print(f"\n{'side':22s}{'kill->next step s':>24s}{'steps redone':>16s}"
          f"{'kill->full speed s':>26s}")
    for name, results in runs.items():
        print(f"{name:22s}{Spread.of(field_of(results, 'next_step_s'))!s:>24s}"
              f"{Spread.of(field_of(results, 'redone'))!s:>16s}"
              f"{Spread.of(field_of(results, 'full_rate_s'))!s:>26s}")
    ours = runs["unipar elastic ddp"]
    fixed, elastic = runs["ray train"], runs["ray train elastic"]

    def versus(name: str, peer: list[float | None]) -> Spread:
        return Spread.of(paired_ratios(field_of(ours, name), peer))

    best_next = faster_peer(field_of(fixed, "next_step_s"), field_of(elastic, "next_step_s"))
    best_full = faster_peer(field_of(fixed, "full_rate_s"), field_of(elastic, "full_rate_s"))
    recovery_ratio = versus("next_step_s", best_next)
    full_rate_ratio = versus("full_rate_s", best_full)
    with_s, without = steady_runs["snapshots"], steady_runs["none"]
    share = Spread.of([None if r is None else r.outside_steps_share for r in with_s])
    floor = Spread.of([None if r is None else r.outside_steps_share for r in without])
    ab = Spread.of([overhead(a.steps_per_s if a else None, b.steps_per_s if b else None)
                    for a, b in zip(with_s, without, strict=True)])
    print(f"\nFSDP steady state: steps/s with snapshots "
          f"{Spread.of([r.steps_per_s if r else None for r in with_s])}, without "
          f"{Spread.of([r.steps_per_s if r else None for r in without])}; A/B overhead {ab} "
          f"(below 0: noise larger than the cost); time between steps beyond the typical gap: "
          f"{share} of the run with snapshots, {floor} without (the noise floor)")
    for name in ("ddp", "fsdp", "hsdp"):
        results = runs[f"unipar elastic {name}"]
        verdict.check(all(r is not None and math.isfinite(r.next_step_s) for r in results),
                      f"unipar elastic {name}: every killed run finished and trained on")
    verdict.check(all(r is not None for r in fixed + elastic),
                  "Ray Train (fixed and elastic): every killed run finished")
    verdict.target("recovery_ratio", recovery_ratio, 0.15)
    verdict.target("snapshot_share", share, 0.03)
    return verdict.finish({
        "recovery_ratio": recovery_ratio,
        "recovery_vs_fixed": versus("next_step_s", field_of(fixed, "next_step_s")),
        "recovery_vs_elastic": versus("next_step_s", field_of(elastic, "next_step_s")),
        "full_rate_ratio": full_rate_ratio,
        "steps_lost": Spread.of(field_of(ours, "redone")).median,
        "steps_lost_fsdp": Spread.of(field_of(runs["unipar elastic fsdp"], "redone")).median,
        "steps_lost_hsdp": Spread.of(field_of(runs["unipar elastic hsdp"], "redone")).median,
        "next_step_fsdp_s": Spread.of(field_of(runs["unipar elastic fsdp"], "next_step_s")),
        "next_step_hsdp_s": Spread.of(field_of(runs["unipar elastic hsdp"], "next_step_s")),
        "full_rate_fsdp_s": Spread.of(field_of(runs["unipar elastic fsdp"], "full_rate_s")),
        "full_rate_hsdp_s": Spread.of(field_of(runs["unipar elastic hsdp"], "full_rate_s")),
        "snapshot_share": share,
        "snapshot_overhead": ab,
    })


if __name__ == "__main__":
    sys.exit(main())
