"""Tuning the demo GPT: 16 configurations of lr, warm-up and weight decay, (a) all to the
full length (FIFO), (b) the same 16 under ASHA; and one trial's time from submission to
its first step under unipar vs a plain Ray Tune + Ray Train TorchTrainer trial.

Every trial trains on the first nine tenths of the standard library's text windows and is
judged on a fixed sample of the last tenth (benchmarks/workload.py), from its final
checkpoint. compute_ratio: the trial steps ASHA ran over the steps of (a) (16 x the full
length): counted in steps, not wall time, since late ASHA trials run faster alone on an
oversubscribed machine. best_gap: (best held-out loss of (b) - best of (a)) / best of (a),
over the trials that reached the full length (not 0 by construction: it is measured on data
no trial trained on). (a) trains every config to its end the same way in every run (same
seeds, data and steps), so it runs once; ASHA's stopping decisions depend on the order
reports arrive in, so (b) runs ``--repeats`` times. trial_start_ratio: unipar / TorchTrainer
submission-to-first-step, the two alternated ``--repeats`` times.

RESULT: compute_ratio (target <= 0.4), best_gap, trial_start_ratio; each with _min/_max.
"""

from __future__ import annotations

import argparse
import functools
import json
import math
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path

import ray
import workload
from measure import Spread, Verdict, add_common_arguments, alternate, paired_ratios, repeats_of
from ray_head import ray_head
from workload import gpt_held_out, gpt_train

from unipar.job import Job
from unipar.optimizer import LRSchedule, OptimizerSpec, ScheduleKind
from unipar.ray_cluster.session import start_ray
from unipar.recipes import gpt_stdlib
from unipar.tuning.api import tune
from unipar.tuning.choices import DEFAULT_REDUCTION_FACTOR

LRS = (3e-4, 1e-3, 3e-3, 1e-2)
WARMUPS = (0, 8)
DECAYS = (0.0, 0.1)
SEQ_LEN = 128


def make_job(config: dict) -> Job:
    job = gpt_stdlib(steps=int(config["steps"]), global_batch_size=8)
    return replace(
        job,
        dataset=functools.partial(gpt_train, SEQ_LEN),
        optimizer=OptimizerSpec(lr=config["lr"], weight_decay=config["weight_decay"]),
        lr_schedule=LRSchedule(ScheduleKind.WARMUP_COSINE, warmup_steps=int(config["warmup"])),
    )


# -- the arithmetic (pure) ---------------------------------------------------------------


@dataclass(frozen=True)
class Experiment:
    steps_run: int  # trial steps, summed over the trials
    held_out: dict[str, float]  # trial -> held-out loss, for the trials that reached the end


def steps_run(curves: dict[str, tuple[list[int], list[float], str]]) -> int:
    """Trial steps an experiment ran: each trial's last reported step, summed."""
    return sum(steps[-1] for steps, _, _ in curves.values() if steps)


def best_held_out(experiment: Experiment) -> float:
    """The best held-out loss of the trials that reached the full length (NaN losses, from a
    diverged trial, do not count); NaN when none did."""
    losses = [v for v in experiment.held_out.values() if not math.isnan(v)]
    return min(losses) if losses else math.nan


def gap(ours: float, full: float) -> float:
    """(ours - full) / full: the relative held-out loss given up; NaN if either is."""
    if math.isnan(ours) or math.isnan(full) or full <= 0:
        return math.nan
    return (ours - full) / full


def compute_ratios(asha: Sequence[Experiment | None], full: Experiment) -> list[float | None]:
    return [None if a is None else a.steps_run / full.steps_run for a in asha]


# -- the runs ----------------------------------------------------------------------------


def held_out_losses(experiment: Path, steps: int) -> dict[str, float]:
    """Each trial's held-out loss from its final checkpoint, for trials that reached
    ``steps`` (their newest checkpoint is of that step)."""
    import torch

    from unipar.runtime.checkpoint import latest_checkpoint, load_model_state, read_checkpoint

    data = gpt_held_out(SEQ_LEN)
    inputs = torch.stack([data[i][0] for i in range(len(data))])
    targets = torch.stack([data[i][1] for i in range(len(data))])
    out = {}
    for params in sorted(experiment.glob("*/params.json")):
        trial = params.parent
        newest = [c for c in (latest_checkpoint(d) for d in trial.glob("run-*/checkpoints"))
                  if c is not None]
        final = [c for c in newest if read_checkpoint(c).step == steps]
        if not final:
            continue
        job = make_job({**json.loads(params.read_text()), "steps": steps})
        model = job.model()
        model.load_state_dict(load_model_state(final[-1]))
        model.eval()
        with torch.no_grad():
            out[trial.name] = float(job.loss(model(inputs), targets))
    return out


def experiment(scheduler: str, steps: int, root: Path, name: str, *,
               grace_steps: int | None = None,
               reduction_factor: int = DEFAULT_REDUCTION_FACTOR) -> Experiment:
    space = {"lr": {"grid": list(LRS)}, "warmup": {"grid": list(WARMUPS)},
             "weight_decay": {"grid": list(DECAYS)}, "steps": steps}
    began = time.perf_counter()
    result = tune(make_job, space, num_samples=1, searcher="grid", scheduler=scheduler,
                  workers_per_trial=1, storage_path=root, name=name, progress=False, plot=False,
                  grace_steps=grace_steps, reduction_factor=reduction_factor)
    out = Experiment(steps_run(result.curves), held_out_losses(root / name, steps))
    print(f"  {scheduler}: {out.steps_run} trial steps, {len(out.held_out)} trials to the end, "
          f"best held-out {best_held_out(out):.4f} ({time.perf_counter() - began:.0f} s)",
          flush=True)
    return out


def unipar_first_step(root: Path, name: str) -> float:
    import pandas

    began = time.time()
    tune(make_job, {"lr": {"grid": [1e-3]}, "warmup": 0, "weight_decay": 0.0, "steps": 2},
         num_samples=1, searcher="grid", scheduler="fifo", workers_per_trial=1,
         storage_path=root, name=name, progress=False, plot=False)
    frame = pandas.read_csv(next((root / name).glob("*/progress.csv")))
    return float(frame["finished_at"].iloc[0]) - began


def _train_loop(config: dict) -> None:
    import ray.train.torch
    import torch

    job = make_job(config)
    model = ray.train.torch.prepare_model(job.model())
    data = torch.utils.data.DataLoader(job.dataset(), batch_size=job.global_batch_size)
    optimizer = job.build_optimizer(model.parameters())
    inputs, targets = next(iter(data))
    loss = job.loss(model(inputs), targets)
    loss.backward()
    optimizer.step()
    Path(config["mark"]).write_text(repr(time.time()))


def _ray_train_trial(config: dict) -> None:
    from ray.train import RunConfig, ScalingConfig
    from ray.train.torch import TorchTrainer

    TorchTrainer(
        _train_loop,
        train_loop_config=config,
        scaling_config=ScalingConfig(num_workers=1, resources_per_worker={"CPU": 1}),
        run_config=RunConfig(storage_path=config["storage"], name="ray-train-inner"),
    ).fit()


def ray_train_first_step(root: Path, name: str) -> float:
    from ray import tune as ray_tune

    mark = root / f"{name}-mark"
    config = {"lr": 1e-3, "warmup": 0, "weight_decay": 0.0, "steps": 2, "mark": str(mark),
              "storage": str(root / f"{name}-inner")}
    began = time.time()
    ray_tune.Tuner(
        ray_tune.with_resources(_ray_train_trial, {"CPU": 1}),
        param_space=config,
        run_config=ray_tune.RunConfig(storage_path=str(root), name=name, verbose=0),
    ).fit()
    return float(mark.read_text()) - began


def log(line: str) -> None:
    print(line, flush=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=None, help="full length of a trial")
    parser.add_argument("--cpus", type=int, default=4)
    parser.add_argument("--grace-steps", type=int, default=None,
                        help="ASHA's grace (default: unipar.tune's, an eighth of the steps)")
    parser.add_argument("--reduction-factor", type=int, default=DEFAULT_REDUCTION_FACTOR,
                        help="ASHA's reduction factor (default: unipar.tune's)")
    add_common_arguments(parser)
    args = parser.parse_args()
    repeats = repeats_of(args, quick=1)
    steps = args.steps or (16 if args.quick else 48)
    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])
    ray.cloudpickle.register_pickle_by_value(workload)
    with ray_head(num_cpus=args.cpus) as address, tempfile.TemporaryDirectory() as directory:
        start_ray(address)
        root = Path(directory)
        full = experiment("fifo", steps, root, "full")
        counter = iter(range(10**6))
        asha = alternate(
            {"asha": lambda: experiment("asha", steps, root, f"asha-{next(counter)}",
                                        grace_steps=args.grace_steps,
                                        reduction_factor=args.reduction_factor)},
            repeats, log=log)["asha"]
        starts = alternate(
            {"unipar": lambda: unipar_first_step(root, f"start-unipar-{next(counter)}"),
             "ray train": lambda: ray_train_first_step(root, f"start-ray-{next(counter)}")},
            repeats, log=log)
        ray.shutdown()
    return report(full, asha, starts, quick=args.quick)


def report(full: Experiment, asha: list[Experiment | None],
           starts: dict[str, list[float | None]], *, quick: bool) -> int:
    verdict = Verdict(quick=quick)
    compute = Spread.of(compute_ratios(asha, full))
    full_best = best_held_out(full)
    best_gap = Spread.of([None if a is None else gap(best_held_out(a), full_best) for a in asha])
    start_ratio = Spread.of(paired_ratios(starts["unipar"], starts["ray train"]))
    print(f"full: {full.steps_run} trial steps, best held-out {full_best:.4f}")
    print(f"asha: trial steps / full {compute}; best held-out gap {best_gap}")
    print(f"first step: unipar {Spread.of(starts['unipar'])} s, Ray Tune + Ray Train "
          f"{Spread.of(starts['ray train'])} s")
    verdict.check(len(full.held_out) == len(LRS) * len(WARMUPS) * len(DECAYS),
                  f"every FIFO trial reached the full length ({len(full.held_out)} did)")
    verdict.check(not best_gap.missing, "every ASHA run took some trial to the full length")
    verdict.target("compute_ratio", compute, 0.4)
    return verdict.finish({"compute_ratio": compute, "best_gap": best_gap,
                           "trial_start_ratio": start_ratio})


if __name__ == "__main__":
    sys.exit(main())
