"""The tiny job the tuning tests search over: an MLP whose learning rate, warm-up and
weight decay come from the trial's config; ``kill_marker`` makes the worker SIGKILL its
own process once, mid-run (while the marker file exists); ``step_delay_s`` slows each
step, so that concurrent trials' reports overlap (PBT compares live trials only), and
``start_together`` (a count, with ``start_folder``) holds each trial's first step until that many
trials have reached theirs: on a loaded machine the trials' workers start seconds apart,
and a trial that starts after the others have passed their exploit points meets none."""

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
    """The MSE loss, after sleeping ``delay_s`` (one call per step: one micro-batch); the
    first call waits (up to 60 s) until ``together`` processes have made their first
    call, each leaving a file in ``folder``."""

    def __init__(self, delay_s: float, folder: str | None = None, together: int = 1) -> None:
        self.delay_s, self.folder, self.together = delay_s, folder, together
        self.started = False

    def __call__(self, outputs, targets):  # type: ignore[no-untyped-def]
        if not self.started and self.folder:
            folder = Path(self.folder)
            folder.mkdir(parents=True, exist_ok=True)
            (folder / str(os.getpid())).touch()
            deadline = time.monotonic() + 60
            while len(list(folder.iterdir())) < self.together and time.monotonic() < deadline:
                time.sleep(0.05)
        self.started = True
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
        together = int(config.get("start_together", 1))
        loss = SlowLoss(float(config["step_delay_s"]), config.get("start_folder"), together)
        job = replace(job, loss=loss)
    return job
