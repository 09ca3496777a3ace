"""The tiny job the tuning tests search over: an MLP whose learning rate, warm-up and
weight decay come from the trial's config."""

from __future__ import annotations

from dataclasses import replace

from unipar.job import LRSchedule, OptimizerSpec
from unipar.testing import tiny_mlp_job

STEPS = 8


def make_job(config: dict) -> object:
    job = tiny_mlp_job(steps=int(config.get("steps", STEPS)), global_batch_size=8)
    return replace(
        job,
        optimizer=OptimizerSpec(lr=config["lr"], weight_decay=config.get("weight_decay", 0.0)),
        lr_schedule=LRSchedule(warmup_steps=int(config.get("warmup", 0))),
    )
