"""Tuning the demo GPT: 16 configurations of lr, warm-up and weight decay, (a) all to the
full length (FIFO), (b) the same 16 under ASHA; and one trial's time from submission to
its first step under unipar vs a plain Ray Tune + Ray Train TorchTrainer trial.

compute_ratio: worker-seconds of (b) over (a) (each trial's wall time x its workers);
best_gap: (best of b - best of a) / best of a, each trial's loss the mean of its last 4
reports at the full length; trial_start_ratio: unipar / TorchTrainer submission-to-first-step.
"""

from __future__ import annotations

import argparse
import logging
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

import ray

from unipar.optimizer import LRSchedule, OptimizerSpec, ScheduleKind
from unipar.recipes import gpt_stdlib
from unipar.tuning.api import tune

LRS = (3e-4, 1e-3, 3e-3, 1e-2)
WARMUPS = (0, 8)
DECAYS = (0.0, 0.1)


def make_job(config: dict) -> object:
    job = gpt_stdlib(steps=int(config["steps"]), global_batch_size=8)
    return replace(
        job,
        optimizer=OptimizerSpec(lr=config["lr"], weight_decay=config["weight_decay"]),
        lr_schedule=LRSchedule(ScheduleKind.WARMUP_COSINE, warmup_steps=int(config["warmup"])),
    )


def _experiment(scheduler: str, steps: int, root: Path) -> tuple[float, float, float]:
    """(worker-seconds, best loss at the full length, seconds) of one experiment."""
    space = {
        "lr": {"grid": list(LRS)},
        "warmup": {"grid": list(WARMUPS)},
        "weight_decay": {"grid": list(DECAYS)},
        "steps": steps,
    }
    began = time.perf_counter()
    result = tune(
        make_job,
        space,
        num_samples=1,
        searcher="grid",
        scheduler=scheduler,
        workers_per_trial=1,
        storage_path=root,
        name=scheduler,
        progress=False,
        plot=False,
    )
    seconds = time.perf_counter() - began
    worker_s, finals = 0.0, []
    for steps_seen, losses, _status in result.curves.values():
        if steps_seen and steps_seen[-1] >= steps:
            finals.append(sum(losses[-4:]) / len(losses[-4:]))
    for path in (root / scheduler).glob("*/progress.csv"):
        import pandas

        worker_s += float(pandas.read_csv(path)["time_total_s"].iloc[-1])  # 1 worker each
    return worker_s, min(finals), seconds


def _unipar_first_step(root: Path) -> float:
    began = time.time()
    result = tune(
        make_job,
        {"lr": {"grid": [1e-3]}, "warmup": 0, "weight_decay": 0.0, "steps": 2},
        num_samples=1,
        searcher="grid",
        scheduler="fifo",
        workers_per_trial=1,
        storage_path=root,
        name="start-unipar",
        progress=False,
        plot=False,
    )
    import pandas

    frame = pandas.read_csv(next((root / "start-unipar").glob("*/progress.csv")))
    assert result.rows
    return float(frame["finished_at"].iloc[0]) - began


def _train_loop(config: dict) -> None:
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

    trainer = TorchTrainer(
        _train_loop,
        train_loop_config=config,
        scaling_config=ScalingConfig(num_workers=1, resources_per_worker={"CPU": 1}),
        run_config=RunConfig(storage_path=config["storage"], name="ray-train-inner"),
    )
    trainer.fit()


def _ray_train_first_step(root: Path) -> float:
    from ray import tune as ray_tune

    mark = root / "first-step-ray-train"
    config = {"lr": 1e-3, "warmup": 0, "weight_decay": 0.0, "steps": 2}
    config = {**config, "mark": str(mark), "storage": str(root / "ray-train")}
    began = time.time()
    trainable = ray_tune.with_resources(_ray_train_trial, {"CPU": 1})
    ray_tune.Tuner(
        trainable,
        param_space=config,
        run_config=ray_tune.RunConfig(storage_path=str(root), name="start-ray-train", verbose=0),
    ).fit()
    return float(mark.read_text()) - began


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--steps", type=int, default=48)
    parser.add_argument("--cpus", type=int, default=4)
    args = parser.parse_args()
    ray.init(
        address="local", num_cpus=args.cpus, include_dashboard=False, logging_level=logging.WARNING
    )
    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])
    with tempfile.TemporaryDirectory() as directory:
        root = Path(directory)
        full_ws, full_best, full_s = _experiment("fifo", args.steps, root)
        asha_ws, asha_best, asha_s = _experiment("asha", args.steps, root)
        ray_train = _ray_train_first_step(root)
        unipar_start = _unipar_first_step(root)
    ray.shutdown()
    print(f"full:  {full_ws:8.1f} worker-s  best {full_best:.4f}  ({full_s:.0f} s)")
    print(f"asha:  {asha_ws:8.1f} worker-s  best {asha_best:.4f}  ({asha_s:.0f} s)")
    print(f"first step: unipar {unipar_start:.2f} s, Ray Tune + Ray Train {ray_train:.2f} s")
    print(
        f"RESULT compute_ratio={asha_ws / full_ws:.3f} "
        f"best_gap={(asha_best - full_best) / full_best:.4f} "
        f"trial_start_ratio={unipar_start / ray_train:.3f}"
    )


if __name__ == "__main__":
    main()
