"""Time to a held-out loss: fixed global batches against the adaptive batch, two real tasks.

Tasks, each on the same 2 data-parallel workers:
- gpt: the demo GPT (``unipar train gpt-stdlib``'s model, optimizer and schedule) on the
  standard library's text, the last tenth of the windows held out;
- digits: scikit-learn's handwritten digits (1797 8x8 images), an MLP classifier, a
  fifth of the images held out.
Each task's job has an initial batch M0, its natural default, for which its learning rate
and schedule are written: 32 for both, the gpt-stdlib recipe's own ``global_batch_size``
(``unipar train gpt-stdlib``), and for the digits job the batch Bengio (2012, "Practical
recommendations for gradient-based training of deep architectures", §3.1) gives as a good
default. The fixed sweep runs each job as written at other batches (same learning rate and
schedule in its own steps); the adaptive run starts at M0 and may move within the sweep's
range (``min_global_batch`` = the sweep's smallest, ``max_global_batch`` = 4 × M0 or
more), every other setting of AdaptiveBatch left at its default. Every run trains for the
same budget of samples (gpt: the recipe's 200 steps of 32; an adaptive run's ends at the
same scale-invariant progress) on the same workers, seed and data order.
Every run is evaluated at the same cadence in samples: the held-out loss is measured
afterwards at the first step at or after each multiple of ``checkpoint_samples`` (where
every run checkpoints: an adaptive run's ``checkpoint_every`` counts steps of batch M0 in
samples), so checkpoint writes disturb every run alike. A run's time to the target is the sum of its
step times (``StepMetrics.step_time_s``: the adaptive bookkeeping and choices are in it;
checkpoint writes and the start of the workers are not) up to the first evaluation at or
below the target.

vs_best_fixed = adaptive / best fixed batch; vs_default = adaptive / fixed M0 (the job as
written). The RESULT line holds the worse of the two tasks for each, and overhead: the
median step time with the adaptive machinery on but the batch pinned at M0 over the plain
run's (the estimator's cost). Every run is repeated ``--repeats`` times (default 3), each
pass in the reverse order of the one before (a shared machine's load drifts); each ratio
is the median of the passes' ratios, with its range (_min/_max). A run that never reaches
the target has an infinite time: the adaptive run's is a failure (printed; exit status 1),
a fixed batch's is printed, and an unreached M0 leaves vs_default undefined (nan), never 0.
"""

from __future__ import annotations

import argparse
import functools
import math
import os
import statistics
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

import ray
import torch
import workload
from measure import Spread, Verdict, add_common_arguments, paired_ratios, repeats_of
from torch.utils.data import Dataset
from workload import gpt_held_out, gpt_train

from unipar import Job, Plan, fit, load_model_state
from unipar.adapt import AdaptiveBatch
from unipar.job import cross_entropy_loss
from unipar.models.mlp import MLP, MLPConfig
from unipar.optimizer import LRSchedule, OptimizerSpec, ScheduleKind
from unipar.ray_cluster.session import start_ray
from unipar.recipes import gpt_stdlib

WORKERS = 2


# --- the tasks' data ---------------------------------------------------------------


class Digits(Dataset):
    """scikit-learn's digits, standardised; ``held_out`` selects the fixed fifth."""

    def __init__(self, held_out: bool) -> None:
        from sklearn.datasets import load_digits

        x, y = load_digits(return_X_y=True)
        x = torch.tensor(x, dtype=torch.float32)
        x = (x - x.mean(0)) / (x.std(0) + 1.0)
        order = torch.randperm(len(y), generator=torch.Generator().manual_seed(0))
        cut = len(y) // 5
        keep = order[:cut] if held_out else order[cut:]
        self.x, self.y = x[keep], torch.tensor(y, dtype=torch.long)[keep]

    def __len__(self) -> int:
        return len(self.y)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.x[index], self.y[index]


def digits_model() -> torch.nn.Module:
    return MLP(MLPConfig(in_features=64, hidden=64, layers=2, out_features=10, expansion=2))


# --- tasks ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Task:
    name: str
    job: Callable[[int, int], Job]  # (global batch, steps) -> job
    held_out: Callable[[], Dataset]
    init_batch: int  # M0: the job as written
    fixed: tuple[int, ...]
    max_batch: int
    min_batch: int
    samples: int  # budget of every run
    target: float  # held-out loss
    checkpoint_samples: int  # about this many samples between checkpoints


def gpt_job(batch: int, steps: int) -> Job:
    job = gpt_stdlib(steps=steps, global_batch_size=batch)
    return replace(job, name="adaptive-gpt", dataset=functools.partial(gpt_train, 128))


def digits_job(batch: int, steps: int) -> Job:
    return Job(
        name="adaptive-digits",
        model=digits_model,
        dataset=functools.partial(Digits, False),
        global_batch_size=batch,
        steps=steps,
        loss=cross_entropy_loss,
        optimizer=OptimizerSpec(kind="sgd", lr=0.02, momentum=0.9),
        lr_schedule=LRSchedule(ScheduleKind.CONSTANT),
    )


def tasks(scale: float) -> list[Task]:
    return [
        Task(
            "gpt",
            gpt_job,
            functools.partial(gpt_held_out, 128),
            32,
            (8, 16, 32, 64),
            128,
            8,
            int(6400 * scale),
            2.4,
            256,
        ),
        Task(
            "digits",
            digits_job,
            functools.partial(Digits, True),
            32,
            (8, 32, 64, 128, 256),
            512,
            8,
            int(12288 * scale),
            0.20,
            256,
        ),
    ]


# --- runs ----------------------------------------------------------------------------


@torch.no_grad()
def held_out_loss(task: Task, job: Job, checkpoint: Path, data: Dataset) -> float:
    model = job.model()
    model.load_state_dict(load_model_state(checkpoint))
    model.eval()
    inputs = torch.stack([data[i][0] for i in range(len(data))])
    targets = torch.stack([data[i][1] for i in range(len(data))])
    return float(job.loss(model(inputs), targets))


@dataclass(frozen=True)
class Run:
    label: str
    seconds_to_target: float  # inf: not reached within the budget
    best_loss: float
    mean_step_s: float
    final_batch: int
    median_step_s: float


def run(task: Task, batch: int | None, root: Path, pinned: bool = False) -> Run:
    """A fixed ``batch``, or (None) the adaptive batch from M0 (``pinned``: bounded at M0)."""
    m0 = task.init_batch
    size = batch or m0
    # An adaptive run's steps are steps of batch M0: it ends when its scale-invariant
    # progress has made as many, so every run has the same budget and schedule horizon.
    job = task.job(size, max(1, task.samples // size))
    every = max(1, task.checkpoint_samples // size)
    if batch is None:
        adaptive = (
            AdaptiveBatch(max_global_batch=m0)
            if pinned
            else AdaptiveBatch(max_global_batch=task.max_batch, min_global_batch=task.min_batch)
        )
        job = replace(job, adaptive=adaptive)
        # an adaptive run's checkpoint_every counts steps of batch M0 in samples
    label = f"{task.name} {'adaptive' if batch is None else f'batch {batch}'}"
    label += " (pinned at M0)" if pinned else ""
    run_dir = root / label.replace(" ", "-").replace("(", "").replace(")", "")
    plan = Plan.data_parallel(WORKERS, size)
    result = fit(
        job,
        workers=WORKERS,
        plan=plan,
        run_dir=run_dir,
        checkpoint_every=every,
        keep_checkpoints=100_000,
        progress=False,
    )
    elapsed, by_step, samples, evaluated = 0.0, {}, 0, set()
    at_batch: dict[int, float] = {}
    seen: dict[int, str] = {}  # each batch's figures at its first step
    for metrics in result.history:
        elapsed += metrics.step_time_s
        by_step[metrics.step + 1] = elapsed
        ran = metrics.adapt.global_batch if metrics.adapt is not None else size
        at_batch[ran] = at_batch.get(ran, 0.0) + metrics.step_time_s
        if metrics.adapt is not None and ran not in seen:
            a = metrics.adapt
            seen[ran] = (
                f"from step {metrics.step} (noise {a.noise_scale:.3g}, eff {a.efficiency:.2f},"
                f" lr x{a.lr_factor:.2f})"
            )
        mark = (samples + ran) // task.checkpoint_samples
        if mark > samples // task.checkpoint_samples:  # crossed a multiple: evaluated
            evaluated.add(metrics.step + 1)
        samples += ran
    data = task.held_out()
    reached, best = math.inf, math.inf
    for checkpoint in sorted(result.checkpoint_dir.glob("step_*")):
        step = int(checkpoint.name.split("_")[1])
        if step not in evaluated and step != len(result.history):
            continue
        loss = held_out_loss(task, job, checkpoint, data)
        best = min(best, loss)
        if loss <= task.target:
            reached = by_step[step]
            break
    steps = result.history
    last = steps[-1].adapt.global_batch if steps[-1].adapt is not None else size
    mean = sum(m.step_time_s for m in steps[1:]) / max(1, len(steps) - 1)
    median = statistics.median(m.step_time_s for m in steps[1:]) if len(steps) > 1 else 0.0
    outcome = Run(label, reached, best, mean, last, median)
    print(
        f"{label:34s} to {task.target}: {reached:7.2f} s  (best held-out {best:.3f}, "
        f"{len(steps)} steps, {samples} samples, mean step {mean * 1e3:.1f} ms, last batch "
        f"{last}; load {os.getloadavg()[0]:.1f})",
        flush=True,
    )
    if batch is None and not pinned:
        for b, t in sorted(at_batch.items()):
            print(f"{'':34s} batch {b:4d}: {t:6.3f} s {seen[b]}", flush=True)
    return outcome


@dataclass(frozen=True)
class TaskRatios:
    vs_best: Spread  # adaptive / the fastest fixed batch of each pass
    vs_default: Spread  # adaptive / fixed M0 of each pass
    reached: bool  # the adaptive run reached the target in every pass


def task_ratios(adaptive: list[float], fixed: dict[int, list[float]], init_batch: int
                ) -> TaskRatios:
    """Per pass, the adaptive run's time to the target over the best fixed batch's and over
    M0's. A time is ``inf`` where the target was not reached: the adaptive run's makes its
    ratios infinite (and the task a failure); a fixed batch's takes it out of "best", and
    M0's leaves no comparison (NaN, which no target accepts), never a ratio of 0."""
    passes = range(len(adaptive))
    best = [min(times[i] for times in fixed.values()) for i in passes]
    return TaskRatios(
        Spread.of(paired_ratios(adaptive, best)),
        Spread.of(paired_ratios(adaptive, fixed[init_batch])),
        all(math.isfinite(t) for t in adaptive),
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--scale", type=float, default=None, help="sample budget factor")
    parser.add_argument("--only", choices=("gpt", "digits"), default=None)
    add_common_arguments(parser)
    args = parser.parse_args()
    repeats = repeats_of(args, quick=1)
    scale = args.scale or (0.25 if args.quick else 1.0)
    if args.quick and args.only is None:
        args.only = "digits"  # the gpt task reaches its target only with its whole budget
    verdict = Verdict(quick=args.quick)
    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])
    ray.cloudpickle.register_pickle_by_value(workload)
    start_ray(None, num_cpus=WORKERS)
    results: list[TaskRatios] = []
    overheads = []
    with tempfile.TemporaryDirectory(prefix="adaptive-batch-") as tmp:
        for task in tasks(scale):
            if args.only not in (None, task.name):
                continue
            configs: list[tuple[int | None, bool]] = [(b, False) for b in task.fixed]
            configs += [(None, False), (None, True)]
            runs: dict[tuple[int | None, bool], list[Run]] = {c: [] for c in configs}
            for rep in range(repeats):
                root = Path(tmp) / f"pass{rep}"
                for config in configs if rep % 2 == 0 else configs[::-1]:
                    runs[config].append(run(task, config[0], root, pinned=config[1]))

            def times(config: tuple[int | None, bool], runs=runs) -> list[float]:
                return [r.seconds_to_target for r in runs[config]]

            ratios = task_ratios(times((None, False)),
                                 {b: times((b, False)) for b in task.fixed}, task.init_batch)
            results.append(ratios)
            for b in task.fixed:
                unreached = sum(not math.isfinite(t) for t in times((b, False)))
                if unreached:
                    print(f"{task.name}: fixed batch {b} did NOT reach {task.target} in "
                          f"{unreached} of {repeats} passes", flush=True)
            verdict.check(ratios.reached, f"{task.name}: the adaptive run reached the held-out "
                          f"loss {task.target} in every pass (times "
                          f"{[round(t, 2) for t in times((None, False))]})")
            overheads.append(
                statistics.median(
                    p.median_step_s / f.median_step_s - 1
                    for p, f in zip(runs[(None, True)], runs[(task.init_batch, False)], strict=True)
                )
            )
            print(
                f"{task.name}: adaptive / best fixed = {ratios.vs_best}, adaptive / M0 = "
                f"{ratios.vs_default}, estimator overhead {overheads[-1]:+.1%} of the median "
                f"step time; load {os.getloadavg()[0]:.1f}",
                flush=True,
            )
    ray.shutdown()
    # the worse task of each ratio; a missing ratio (nan) is the worst: shown, not hidden
    worst_best = max(results, key=lambda r: math.inf if r.vs_best.missing else r.vs_best.median)
    worst_default = max(results, key=lambda r: math.inf if r.vs_default.missing
                        else r.vs_default.median)
    return verdict.finish({
        "vs_best_fixed": worst_best.vs_best,
        "vs_default": worst_default.vs_default,
        "overhead": max(overheads),
    })


if __name__ == "__main__":
    sys.exit(main())
