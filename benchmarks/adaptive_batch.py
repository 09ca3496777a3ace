"""Time to a held-out loss: fixed global batches against the adaptive batch, two real tasks,
and Pollux's measured applications on 1, 4 and 16 simulated GPUs (``--traces``).

Tasks, each on the same 2 data-parallel workers:
- gpt: the demo GPT (``unipar train gpt-stdlib``'s model, optimizer and schedule) on the
  standard library's text, the last tenth of the windows held out;
- digits: scikit-learn's handwritten digits (1797 8x8 images), an MLP classifier (hidden
  1024: a step heavy enough that a run lasts seconds), a fifth of the images held out.
Each task's job has an initial batch M0, its natural default, for which its learning rate
and schedule are written: 32 for both, the gpt-stdlib recipe's own ``global_batch_size``,
and for the digits job the batch Bengio (2012, "Practical recommendations for
gradient-based training of deep architectures", §3.1) gives as a good default.

The sweep runs every fixed batch under the same rules as the adaptive run: the batch held
there by ``AdaptiveBatch(min_global_batch=B, max_global_batch=B)``, so its learning rate
is M0's scaled by the same documented rule (AdaScale's gain for SGD, AdaptDL's √gain for
Adam; :mod:`unipar.adapt.lr`) and its schedule runs on the same scale-invariant progress,
ending at the same progress (the recipe's steps of M0): the benchmark measures the choice
of batch, not a recipe. The recipe as written at each batch (the same learning rate, the
schedule in its own steps over the same samples) runs too, as information; at M0 it is
the job as written. The adaptive run starts at M0 and may move within the sweep's range
(``min_global_batch`` = the sweep's smallest, ``max_global_batch`` = 4 × M0 or more),
every other setting of AdaptiveBatch left at its default. Every run uses the same
workers, seed and data order.
Every run is evaluated at the same cadence in samples: the held-out loss is measured
afterwards at the first step at or after each multiple of ``checkpoint_samples`` (where
every run checkpoints: an adaptive run's ``checkpoint_every`` counts steps of batch M0 in
samples), so checkpoint writes disturb every run alike. A run's time to the target is the
sum of its step times (``StepMetrics.step_time_s``: the adaptive bookkeeping and choices
are in it; checkpoint writes and the start of the workers are not) up to the first
evaluation at or below the target.

vs_best_fixed = adaptive / best fixed batch (same rules); vs_default = adaptive / fixed M0
(the job as written); recipe_vs_best_fixed = adaptive / best batch of the recipe as
written (information); overhead = the median step time with the adaptive machinery on but
the batch held at M0 over the plain run's, less 1 (the estimator's cost). Every run is
repeated ``--repeats`` times (default 3), each pass in the reverse order of the one before
(a shared machine's load drifts); each figure is the median of the passes' figures, with
its range (_min/_max); the RESULT line holds the worse task of each. A run that never
reaches the target has an infinite time: the adaptive run's is a failure (printed; exit
status 1), a fixed batch's is printed, and an unreached M0 leaves vs_default undefined
(nan), never 0.

The full measurement, on a quiet 2-core machine: ``python benchmarks/adaptive_batch.py``
(both tasks, 3 passes); ``--only``, ``--scale`` and ``--repeats`` for a smaller run,
``--quick`` for a smoke run (the digits task alone, one pass).
``--traces`` (a pure simulation, no training) prints ``RESULT traces_vs_best_fixed=<worst>
traces_vs_default=<median>``.
"""

from __future__ import annotations

import argparse
import functools
import math
import os
import shutil
import statistics
import sys
import tempfile
from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace
from enum import Enum
from pathlib import Path

import ray
import torch
import workload
from measure import Spread, Verdict, add_common_arguments, paired_ratios, ratio, repeats_of
from torch.utils.data import Dataset
from workload import gpt_held_out, gpt_train

from unipar import Job, Plan, fit, load_model_state
from unipar.adapt import AdaptiveBatch
from unipar.job import cross_entropy_loss
from unipar.models.mlp import MLP, MLPConfig
from unipar.optimizer import LRSchedule, OptimizerSpec, ScheduleKind
from unipar.ray_cluster.session import start_ray
from unipar.recipes import gpt_stdlib
from unipar.sched.solo import (
    adaptive_run,
    best_schedule_run,
    fixed_run,
    measured_batches,
    requested_batch,
)
from unipar.sched.traces import default_reference_dir, load_applications
from unipar.sched.workload import read_workload

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
    return MLP(MLPConfig(in_features=64, hidden=1024, layers=2, out_features=10, expansion=2))


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
        optimizer=OptimizerSpec(kind="sgd", lr=0.01, momentum=0.9),
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
            int(16384 * scale),
            0.07,
            1024,
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


class Mode(Enum):
    """How a run sets its batch and learning rate."""

    SAME_RULES = "same rules"  # held at the batch, the rule from M0, progress its clock
    RECIPE = "recipe"  # the job as written at the batch: its rate, schedule in its steps
    ADAPTIVE = "adaptive"  # starts at M0, moves within the sweep's range


def run(task: Task, batch: int, mode: Mode, root: Path) -> Run:
    """One run of ``task`` at ``batch`` (for ``ADAPTIVE``: the M0 it starts from)."""
    m0 = task.init_batch
    if mode is Mode.RECIPE:
        job = task.job(batch, max(1, task.samples // batch))
        every = max(1, task.checkpoint_samples // batch)
    else:  # steps of batch M0: the run ends when its scale-invariant progress made them
        job = task.job(m0, max(1, task.samples // m0))
        every = max(1, task.checkpoint_samples // m0)  # counted in steps of M0's samples
        least, most = (batch, batch) if mode is Mode.SAME_RULES else (task.min_batch,
                                                                          task.max_batch)
        job = replace(job, adaptive=AdaptiveBatch(max_global_batch=most, min_global_batch=least))
    label = f"{task.name} {'adaptive' if mode is Mode.ADAPTIVE else f'batch {batch}'}"
    label += f" ({mode.value})" if mode is not Mode.ADAPTIVE else ""
    run_dir = root / label.replace(" ", "-").replace("(", "").replace(")", "")
    plan = Plan.data_parallel(WORKERS, job.global_batch_size)
    result = fit(
        job,
        workers=WORKERS,
        plan=plan,
        run_dir=run_dir,
        checkpoint_every=every,
        keep_checkpoints=100_000,
        progress=False,
    )
    size = job.global_batch_size
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
        f"{label:38s} to {task.target}: {reached:7.2f} s  (best held-out {best:.3f}, "
        f"{len(steps)} steps, {samples} samples, mean step {mean * 1e3:.1f} ms, last batch "
        f"{last}; load {os.getloadavg()[0]:.1f})",
        flush=True,
    )
    if mode is Mode.ADAPTIVE:
        for b, t in sorted(at_batch.items()):
            print(f"{'':34s} batch {b:4d}: {t:6.3f} s {seen[b]}", flush=True)
        if math.isinf(reached):
            print(f"{'':34s} target never reached: a failure", flush=True)
    shutil.rmtree(run_dir, ignore_errors=True)  # its checkpoints are evaluated: free the disk
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


def step_overhead(held: list[Run], plain: list[Run]) -> Spread:
    """Per pass, the median step time with the adaptive machinery on (batch held at M0)
    over the plain run's, less 1; NaN where a run had no timed step."""
    return Spread.of([ratio(h.median_step_s, p.median_step_s) - 1
                      for h, p in zip(held, plain, strict=True)])


def worst(figures: Iterable[Spread]) -> Spread:
    """The task with the largest median; a missing figure (NaN) is the worst: shown, not
    hidden."""
    return max(figures, key=lambda s: math.inf if s.missing else s.median)


def sweep(args: argparse.Namespace) -> int:
    """The two tasks on 2 workers: every fixed batch under the same rules and as written,
    and the adaptive run, ``--repeats`` passes in alternating order."""
    repeats = repeats_of(args, quick=1)
    # --quick: the digits task alone, its whole budget, one pass. The gpt task reaches its
    # target only with its whole budget, and so does the digits job (hidden 1024, target
    # 0.07): as written, in one process, held-out 0.0785 at a quarter of it (4,096
    # samples), 0.0673 first at half.
    scale = args.scale or 1.0
    if args.quick and args.only is None:
        args.only = "digits"
    verdict = Verdict(quick=args.quick)
    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])
    ray.cloudpickle.register_pickle_by_value(workload)
    start_ray(None, num_cpus=WORKERS)
    same_rules: list[TaskRatios] = []
    recipe: list[TaskRatios] = []  # the recipe as written; its M0 is the job as written
    overheads: list[Spread] = []
    with tempfile.TemporaryDirectory(prefix="adaptive-batch-") as tmp:
        for task in tasks(scale):
            if args.only not in (None, task.name):
                continue
            m0 = task.init_batch
            configs = [(b, Mode.SAME_RULES) for b in task.fixed]
            configs += [(b, Mode.RECIPE) for b in task.fixed]  # M0's recipe: the plain run
            configs += [(m0, Mode.ADAPTIVE)]
            runs: dict[tuple[int, Mode], list[Run]] = {c: [] for c in configs}
            for rep in range(repeats):
                root = Path(tmp) / f"pass{rep}"
                for config in configs if rep % 2 == 0 else configs[::-1]:
                    runs[config].append(run(task, config[0], config[1], root))

            def times(batch: int, mode: Mode, runs=runs) -> list[float]:
                return [r.seconds_to_target for r in runs[(batch, mode)]]

            adaptive = times(m0, Mode.ADAPTIVE)
            for mode, into in ((Mode.SAME_RULES, same_rules), (Mode.RECIPE, recipe)):
                into.append(task_ratios(adaptive, {b: times(b, mode) for b in task.fixed}, m0))
                swept = "  ".join(f"{b}: {Spread.of(times(b, mode))}" for b in task.fixed)
                print(f"{task.name} fixed, {mode.value} (s to {task.target}, median and range "
                      f"of {repeats}): {swept}; adaptive {Spread.of(adaptive)} s: adaptive / "
                      f"best fixed = {into[-1].vs_best}", flush=True)
                for b in task.fixed:
                    unreached = sum(not math.isfinite(t) for t in times(b, mode))
                    if unreached:
                        print(f"{task.name}: fixed batch {b} ({mode.value}) did NOT reach "
                              f"{task.target} in {unreached} of {repeats} passes", flush=True)
            verdict.check(same_rules[-1].reached, f"{task.name}: the adaptive run reached the "
                          f"held-out loss {task.target} in every pass (times "
                          f"{[round(t, 2) for t in adaptive]})")
            overheads.append(step_overhead(runs[(m0, Mode.SAME_RULES)], runs[(m0, Mode.RECIPE)]))
            print(f"{task.name}: adaptive / M0 as written = {recipe[-1].vs_default}, estimator "
                  f"overhead {overheads[-1]} of the median step (batch held at M0 against "
                  f"the plain run); load {os.getloadavg()[0]:.1f}", flush=True)
    ray.shutdown()
    return verdict.finish({
        "vs_best_fixed": worst(r.vs_best for r in same_rules),
        "vs_default": worst(r.vs_default for r in recipe),
        "recipe_vs_best_fixed": worst(r.vs_best for r in recipe),
        "overhead": worst(overheads),
    })


# --- the traces part: Pollux's measured applications, one job alone --------------------

TRACE_SIZES = (1, 4, 16)


def traces(reference: Path | None, seeds: int) -> int:
    """Every Pollux application alone on 1, 4 and 16 GPUs (4 per node), to its trace's
    completion: each fixed batch the trace measured (an even split over the GPUs, each
    GPU's batch one the trace timed) against the adaptive batch (the runtime's
    ``AdaptState`` driven by the trace's step times and gradient statistics, ``seeds``
    seeds of its noisy measurements; :mod:`unipar.sched.solo`). The default batch is
    the one the paper's workloads ask for most often for the application; adaptive /
    default is summarised where the default is not the best fixed batch, beside what the
    best fixed batch and the best batch schedule (``best_schedule_run``: what no batch
    policy beats on the closed form) gain there. A simulation:
    its figures do not depend on the machine's load."""
    if seeds < 1:
        raise SystemExit(f"--seeds must be at least 1, but got {seeds}")
    reference = reference or default_reference_dir()
    apps = load_applications(reference)
    loads = [read_workload(p, apps) for p in sorted((reference / "workloads-1.0").glob("*.csv"))]
    verdict = Verdict()
    worst_to_best: list[float] = []
    own_progress: list[float] = []  # each run's own progress over the trace's
    vs_default: dict[str, float] = {}  # where the default batch is not the best fixed one
    default_to_best: dict[str, float] = {}  # there, the best fixed batch over the default
    schedule_to_default: dict[str, float] = {}  # there, the best batch schedule's
    schedule_to_best: list[float] = []  # the best batch schedule over the best fixed batch
    for name, app in apps.items():
        default = requested_batch(name, loads)
        for gpus in TRACE_SIZES:
            fixed = {b: fixed_run(app, gpus, b).seconds for b in measured_batches(app, gpus)}
            best = min(fixed, key=lambda b: fixed[b])
            bound = best_schedule_run(app, gpus).seconds
            schedule_to_best.append(bound / fixed[best])
            runs = [adaptive_run(app, gpus, seed=seed) for seed in range(seeds)]
            to_best = [ratio(r.seconds, fixed[best]) for r in runs]
            worst_to_best += to_best
            own = [r.estimated_progress / r.target_progress for r in runs]
            own_progress += own
            swept = "  ".join(f"{b}: {t / 3600:.3g}" for b, t in sorted(fixed.items()))
            line = (f"{name:11s} {gpus:2d} GPUs  fixed h  {swept}\n{'':17s}adaptive "
                    f"{Spread.of([r.seconds / 3600 for r in runs])} h over {seeds} seeds "
                    f"(batch mostly {statistics.median(r.final_batch for r in runs):.0f}; own "
                    f"progress {Spread.of(own)} of the trace's)  vs best fixed ({best}) "
                    f"{Spread.of(to_best)}; best schedule / best fixed "
                    f"{schedule_to_best[-1]:.3f}")
            if default in fixed:
                to_default = [ratio(r.seconds, fixed[default]) for r in runs]
                if best != default:  # the target holds where the default is not the best
                    vs_default[f"{name}/{gpus}"] = statistics.median(to_default)
                    default_to_best[f"{name}/{gpus}"] = fixed[best] / fixed[default]
                    schedule_to_default[f"{name}/{gpus}"] = bound / fixed[default]
                line += (f"  vs default ({default}) {Spread.of(to_default)}, best fixed / "
                         f"default {fixed[best] / fixed[default]:.3f}")
            print(line, flush=True)
    verdict.check(all(x <= 1.0 + 1e-9 for x in schedule_to_best), "no fixed batch beats "
                  f"the best batch schedule (its ratio to the best fixed batch at most "
                  f"{max(schedule_to_best):.3f})")
    verdict.check(all(0.9 <= x <= 1.1 for x in own_progress), "every adaptive run's own "
                  f"progress is within 10% of the trace's ({Spread.of(own_progress)})")
    print(f"adaptive / best fixed: worst {max(worst_to_best):.3f} over {len(worst_to_best)} "
          f"runs; adaptive / default where the default is not the best: median "
          f"{statistics.median(vs_default.values()):.3f} over {len(vs_default)} applications "
          f"x sizes (per application x size the median of {seeds} seeds), "
          f"{sum(v <= 0.7 for v in vs_default.values())} at or below 0.7; there the best "
          f"fixed batch over the default: median "
          f"{statistics.median(default_to_best.values()):.3f}, "
          f"{sum(v <= 0.7 for v in default_to_best.values())} at or below 0.7; the best batch "
          f"schedule (each epoch's fastest batch, known exactly: no batch policy does "
          f"better on the closed form) over the default: median "
          f"{statistics.median(schedule_to_default.values()):.3f}, "
          f"{sum(v <= 0.7 for v in schedule_to_default.values())} at or below 0.7", flush=True)
    return verdict.finish({
        "traces_vs_best_fixed": max(worst_to_best),
        "traces_vs_default": statistics.median(vs_default.values()),
        "traces_best_schedule_vs_default": statistics.median(schedule_to_default.values()),
    })


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--scale", type=float, default=None, help="sample budget factor")
    parser.add_argument("--only", choices=("gpt", "digits"), default=None)
    add_common_arguments(parser)
    parser.add_argument("--traces", action="store_true",
                        help="Pollux's measured applications on 1, 4 and 16 simulated GPUs")
    parser.add_argument("--seeds", type=int, default=3, help="--traces: seeds per run")
    parser.add_argument("--reference", type=Path, default=None,
                        help="--traces: the Pollux reference data folder")
    args = parser.parse_args()
    if args.traces:
        return traces(args.reference, args.seeds)
    return sweep(args)


if __name__ == "__main__":
    sys.exit(main())
