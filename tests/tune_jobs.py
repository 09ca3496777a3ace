"""The tiny job the tuning tests search over: an MLP whose learning rate, warm-up and
weight decay come from the trial's config; ``kill_marker`` makes the worker SIGKILL its
own process once, mid-run (while the marker file exists); ``step_delay_s`` slows each
step, so that concurrent trials' reports overlap (PBT compares live trials only)."""

from __future__ import annotations

import os
import signal
import time
from dataclasses import replace
from pathlib import Path

from unipar.job import LRSchedule, OptimizerSpec
from unipar.testing import mse_loss, tiny_mlp_job

STEPS = 8


class KillOnce:
    """The MSE loss; at its ``at``-th call it removes ``marker`` and SIGKILLs its process."""

    def __init__(self, marker: str, at: int) -> None:
        self.marker, self.at, self.calls = Path(marker), at, 0

    def __call__(self, outputs, targets):  # type: ignore[no-untyped-def]
        self.calls += 1
        if self.calls >= self.at and self.marker.exists():
            self.marker.unlink()
            os.kill(os.getpid(), signal.SIGKILL)
        return mse_loss(outputs, targets)


class SlowLoss:
    """The MSE loss, after sleeping ``delay_s`` (one call per step: one micro-batch)."""

    def __init__(self, delay_s: float) -> None:
        self.delay_s = delay_s

    def __call__(self, outputs, targets):  # type: ignore[no-untyped-def]
        time.sleep(self.delay_s)
        return mse_loss(outputs, targets)


def make_job(config: dict) -> object:
    job = tiny_mlp_job(steps=int(config.get("steps", STEPS)), global_batch_size=8)
    job = replace(
        job,
        optimizer=OptimizerSpec(lr=config["lr"], weight_decay=config.get("weight_decay", 0.0)),
        lr_schedule=LRSchedule(warmup_steps=int(config.get("warmup", 0))),
    )
    if config.get("kill_marker"):
        job = replace(job, loss=KillOnce(config["kill_marker"], at=job.steps // 2))
    if config.get("step_delay_s"):
        job = replace(job, loss=SlowLoss(float(config["step_delay_s"])))
    return job
