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
schedule in its own steps over the same samples) runs too, as information. The adaptive
run starts at M0 and may move within the sweep's range (``min_global_batch`` = the sweep's
smallest, ``max_global_batch`` = 4 × M0 or more), every other setting of AdaptiveBatch
left at its default. Every run uses the same workers, seed and data order.
Every run is evaluated at the same cadence in samples: the held-out loss is measured
afterwards at the first step at or after each multiple of ``checkpoint_samples`` (where
every run checkpoints: an adaptive run's ``checkpoint_every`` counts steps of batch M0 in
samples), so checkpoint writes disturb every run alike. A run's time to the target is the
sum of its step times (``StepMetrics.step_time_s``: the adaptive bookkeeping and choices
are in it; checkpoint writes and the start of the workers are not) up to the first
evaluation at or below the target; a run that never gets there has an infinite time, and
an adaptive run that never gets there fails the benchmark.

vs_best_fixed = adaptive / best fixed batch (same rules); vs_default = adaptive / fixed M0
(the job as written). The RESULT line holds the worse of the two tasks for each, the
recipe-as-written sweep's best as information, and overhead: the median step time with the
adaptive machinery on but the batch held at M0 over the plain run's (the estimator's cost).
With ``--repeats N`` (default 3) every run is repeated N times, each pass in the reverse
order of the one before (a shared machine's load drifts); the figures are medians over
the passes, each ratio also per pass with its range.

The full measurement, on a quiet 2-core machine: ``python benchmarks/adaptive_batch.py``
(both tasks, 3 passes); ``--only``, ``--scale`` and ``--repeats 1`` for a smaller run.
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
from collections.abc import Callable
from dataclasses import dataclass, replace
from enum import Enum
from pathlib import Path

import ray
import torch
from torch.utils.data import Dataset, Subset

from unipar import Job, Plan, fit, load_model_state
from unipar.adapt import AdaptiveBatch
from unipar.job import cross_entropy_loss
from unipar.models.mlp import MLP, MLPConfig
from unipar.optimizer import LRSchedule, OptimizerSpec, ScheduleKind
from unipar.ray_cluster.session import start_ray
from unipar.recipes import gpt_stdlib
from unipar.sched.solo import adaptive_run, fixed_run, measured_batches, requested_batch
from unipar.sched.traces import default_reference_dir, load_applications
from unipar.sched.workload import read_workload

ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])

WORKERS = 2


# --- the tasks' data ---------------------------------------------------------------


def _stdlib_windows(seq_len: int):  # type: ignore[no-untyped-def]
    from unipar.data.text import ByteTextDataset, stdlib_corpus

    return ByteTextDataset(stdlib_corpus(), seq_len)


def gpt_train(seq_len: int) -> Dataset:
    windows = _stdlib_windows(seq_len)
    return Subset(windows, range(len(windows) * 9 // 10))


def gpt_held_out(seq_len: int, count: int = 96) -> Dataset:
    windows = _stdlib_windows(seq_len)
    start = len(windows) * 9 // 10
    step = max(1, (len(windows) - start) // count)
    return Subset(windows, range(start, len(windows), step)[:count])


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


def median_time(runs: list[Run]) -> float:
    return statistics.median(r.seconds_to_target for r in runs)


def ratio(adaptive: float, fixed: float) -> float:
    """adaptive / fixed; infinite (a failure) when the adaptive run missed the target,
    or when no fixed run reached it either."""
    return adaptive / fixed if math.isfinite(adaptive) and math.isfinite(fixed) else math.inf


# --- the traces part: Pollux's measured applications, one job alone --------------------

TRACE_SIZES = (1, 4, 16)


def spread(values: list[float]) -> str:
    """Median and range, for a figure over seeds."""
    return f"{statistics.median(values):.3f} ({min(values):.3f}-{max(values):.3f})"


def traces(reference: Path | None, seeds: int) -> None:
    """Every Pollux application alone on 1, 4 and 16 GPUs (4 per node), to its trace's
    completion: each fixed batch the trace measured (an even split over the GPUs, each
    GPU's batch one the trace timed) against the adaptive batch (the runtime's
    ``AdaptState`` driven by the trace's step times and gradient statistics, ``seeds``
    seeds of its noisy measurements; :mod:`unipar.sched.solo`). The default batch is
    the one the paper's workloads ask for most often for the application; adaptive /
    default is summarised where the default is not the best fixed batch, beside what the
    best fixed batch itself gains there (no batch policy gains much more)."""
    reference = reference or default_reference_dir()
    apps = load_applications(reference)
    loads = [read_workload(p, apps) for p in sorted((reference / "workloads-1.0").glob("*.csv"))]
    worst: list[float] = []
    vs_default: dict[str, float] = {}  # where the default batch is not the best fixed one
    default_to_best: dict[str, float] = {}  # there, the best fixed batch over the default
    for name, app in apps.items():
        default = requested_batch(name, loads)
        for gpus in TRACE_SIZES:
            fixed = {b: fixed_run(app, gpus, b).seconds for b in measured_batches(app, gpus)}
            best = min(fixed, key=lambda b: fixed[b])
            runs = [adaptive_run(app, gpus, seed=seed) for seed in range(seeds)]
            hours = [r.seconds / 3600 for r in runs]
            to_best = [r.seconds / fixed[best] for r in runs]
            worst += to_best
            own = [r.estimated_progress / r.target_progress for r in runs]
            if not all(0.9 <= x <= 1.1 for x in own):  # the run's own clock must be right
                raise SystemExit(f"{name} on {gpus}: its own progress {own} of the trace's")
            sweep = "  ".join(f"{b}: {t / 3600:.3g}" for b, t in sorted(fixed.items()))
            line = (f"{name:11s} {gpus:2d} GPUs  fixed h  {sweep}\n{'':17s}adaptive "
                    f"{spread(hours)} h over {seeds} seeds (batch mostly "
                    f"{statistics.median(r.final_batch for r in runs):.0f}; own progress "
                    f"{min(own):.3f}-{max(own):.3f} of the trace's)  vs best fixed ({best}) "
                    f"{spread(to_best)}")
            if default in fixed:
                to_default = [r.seconds / fixed[default] for r in runs]
                if best != default:  # the target holds where the default is not the best
                    vs_default[f"{name}/{gpus}"] = statistics.median(to_default)
                    default_to_best[f"{name}/{gpus}"] = fixed[best] / fixed[default]
                line += (f"  vs default ({default}) {spread(to_default)}, best fixed / "
                         f"default {fixed[best] / fixed[default]:.3f}")
            print(line, flush=True)
    print(f"adaptive / best fixed: worst {max(worst):.3f} over {len(worst)} runs; adaptive / "
          f"default where the default is not the best: median "
          f"{statistics.median(vs_default.values()):.3f} over {len(vs_default)} applications "
          f"x sizes (per application x size the median of {seeds} seeds), "
          f"{sum(v <= 0.7 for v in vs_default.values())} at or below 0.7; there the best "
          f"fixed batch over the default: median "
          f"{statistics.median(default_to_best.values()):.3f}, "
          f"{sum(v <= 0.7 for v in default_to_best.values())} at or below 0.7")
    print(f"RESULT traces_vs_best_fixed={max(worst):.3f} "
          f"traces_vs_default={statistics.median(vs_default.values()):.3f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--scale", type=float, default=1.0, help="sample budget factor")
    parser.add_argument("--only", choices=("gpt", "digits"), default=None)
    parser.add_argument("--repeats", type=int, default=3, help="passes (medians over them)")
    parser.add_argument("--traces", action="store_true",
                        help="Pollux's measured applications on 1, 4 and 16 simulated GPUs")
    parser.add_argument("--seeds", type=int, default=3, help="--traces: seeds per run")
    parser.add_argument("--reference", type=Path, default=None,
                        help="--traces: the Pollux reference data folder")
    args = parser.parse_args()
    if args.traces:
        traces(args.reference, args.seeds)
        return
    start_ray(None, num_cpus=WORKERS)
    figures: dict[str, list[tuple[float, float, float]]] = {}
    overheads = []
    with tempfile.TemporaryDirectory(prefix="adaptive-batch-") as tmp:
        for task in tasks(args.scale):
            if args.only not in (None, task.name):
                continue
            m0 = task.init_batch
            configs = [(b, Mode.SAME_RULES) for b in task.fixed]
            configs += [(b, Mode.RECIPE) for b in task.fixed]  # M0's recipe: the plain run
            configs += [(m0, Mode.ADAPTIVE)]
            runs: dict[tuple[int, Mode], list[Run]] = {c: [] for c in configs}
            for rep in range(args.repeats):
                root = Path(tmp) / f"pass{rep}"
                for config in configs if rep % 2 == 0 else configs[::-1]:
                    runs[config].append(run(task, config[0], config[1], root))
            figures[task.name] = summarise(task, runs, args.repeats)
            overheads.append(statistics.median(
                p.median_step_s / f.median_step_s - 1
                for p, f in zip(runs[(m0, Mode.SAME_RULES)], runs[(m0, Mode.RECIPE)],
                                strict=True)
            ))
            print(f"{task.name}: estimator overhead {overheads[-1]:+.1%} of the median step "
                  f"(batch held at M0 against the plain run)", flush=True)
    ray.shutdown()
    vs_best = max(f[0] for f in figures.values())
    vs_default = max(f[1] for f in figures.values())
    recipe = max(f[2] for f in figures.values())
    print(
        f"RESULT vs_best_fixed={vs_best:.3f} vs_default={vs_default:.3f} "
        f"recipe_vs_best_fixed={recipe:.3f} overhead={max(overheads):.3f}"
    )


def summarise(
    task: Task, runs: dict[tuple[int, Mode], list[Run]], repeats: int
) -> tuple[float, float, float]:
    """Print a task's figures; (adaptive / best fixed, adaptive / M0, adaptive / best of
    the recipe as written), medians over the passes."""
    m0 = task.init_batch
    adaptive = runs[(m0, Mode.ADAPTIVE)]
    out = []
    for mode in (Mode.SAME_RULES, Mode.RECIPE):
        fixed = {b: median_time(runs[(b, mode)]) for b in task.fixed}
        best = min(fixed, key=lambda b: fixed[b])
        per_pass = [ratio(a.seconds_to_target, runs[(best, mode)][i].seconds_to_target)
                    for i, a in enumerate(adaptive)]
        to_best = ratio(median_time(adaptive), fixed[best])
        sweep = "  ".join(f"{b}: {t:.2f}" for b, t in fixed.items())
        print(f"{task.name} fixed, {mode.value} (s, medians of {repeats}): {sweep}; adaptive "
              f"{median_time(adaptive):.2f} s: adaptive / best fixed ({best}) = {to_best:.3f}, "
              f"per pass {spread(per_pass)}", flush=True)
        out.append(to_best)
        if mode is Mode.SAME_RULES:
            default = ratio(median_time(adaptive), fixed[m0])
            per_pass = [ratio(a.seconds_to_target, runs[(m0, mode)][i].seconds_to_target)
                        for i, a in enumerate(adaptive)]
            print(f"{task.name}: adaptive / M0 = {default:.3f}, per pass {spread(per_pass)}; "
                  f"load {os.getloadavg()[0]:.1f}", flush=True)
            out.append(default)
    return out[0], out[1], out[2]


if __name__ == "__main__":
    main()
