"""One trial: a unipar run inside a Ray Tune function trainable.

The trial's workers are reserved as one gang with the trial (a placement-group factory:
an empty head bundle for the trial's driver, one bundle per worker; Tune captures the
workers into it), so trials never hold half a gang each. Every step is reported to Tune;
each new DCP checkpoint goes with its report, so schedulers that pause or exploit (PBT)
restart a trial from it, and a restarted trial resumes from ``tune.get_checkpoint()``.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

from ray import tune
from ray.tune import PlacementGroupFactory

from unipar.job import Job
from unipar.runtime.callbacks import Callback
from unipar.runtime.checkpoint import STATE_FILE, checkpoint_name, list_checkpoints, read_checkpoint
from unipar.runtime.config import RunConfig
from unipar.runtime.metrics import StepMetrics
from unipar.runtime.run import fit

MakeJob = Callable[[dict[str, Any]], Job]

# What every trial reports at each step (StepMetrics' numbers; "step" counts steps done).
REPORTED = ("loss", "lr", "samples", "tokens", "step_time_s", "tokens_per_s", "finished_at", "step")


def checkpoint_plan(steps: int) -> tuple[int, int]:
    """``(every, keep)`` for a trial of ``steps``: a checkpoint every eighth of the steps
    (at least every step), and all of them kept (up to 15 for a short trial), so the one a
    report registers is still there when Tune copies it, however far the workers ran
    ahead, and PBT's donor or a resumed trial finds the one Tune registered."""
    every = max(1, steps // 8)
    return every, -(-steps // every)  # the multiples of ``every``, and the last step


def gang_resources(settings: RunConfig) -> Any:
    """The trial's resources as one gang: an empty head bundle, then one per worker."""
    worker = {"CPU": settings.cpus_per_worker}
    if settings.gpus_per_worker:
        worker["GPU"] = settings.gpus_per_worker
    return PlacementGroupFactory([{}] + [dict(worker) for _ in range(settings.workers)])


class _ReportToTune(Callback):
    """Reports each step to Tune, with the newest DCP checkpoint when one is new."""

    def __init__(self, checkpoints: Path, resumed_from: int, steps: int) -> None:
        self.checkpoints, self.steps = checkpoints, steps
        self.resumed_from = resumed_from  # the step of the checkpoint this run started from
        self.reported: Path | None = None

    def on_step(self, metrics: StepMetrics, workers: Sequence[Any]) -> None:
        row = {k: v for k, v in asdict(metrics).items() if k in REPORTED}
        row["step"] = metrics.step + 1
        row["resumed_from"] = self.resumed_from
        row["job_steps"] = self.steps  # this trial's own (the steps may be searched)
        if row["step"] == self.steps:  # the last report carries the final checkpoint
            _wait_for(self.checkpoints / checkpoint_name(self.steps))
        # The newest checkpoint not past this step: workers may run ahead of the reports.
        done = [p for p in list_checkpoints(self.checkpoints) if _step_of(p) <= row["step"]]
        checkpoint = None
        if done and done[-1] != self.reported:
            self.reported = done[-1]
            checkpoint = tune.Checkpoint.from_directory(str(done[-1]))
        tune.report(row, checkpoint=checkpoint)


def _wait_for(checkpoint: Path, timeout_s: float = 60.0) -> None:
    """Wait until the workers have written ``checkpoint`` (its state file comes last)."""
    deadline = time.monotonic() + timeout_s
    while not (checkpoint / STATE_FILE).is_file() and time.monotonic() < deadline:
        time.sleep(0.05)


def _step_of(checkpoint: Path) -> int:
    """The step in a checkpoint's name (``checkpoint_name``: a prefix, then 8 digits)."""
    return int(checkpoint.name[-8:])


def run_trial(config: dict[str, Any], *, make_job: MakeJob, settings: RunConfig) -> None:
    """The function trainable: build the trial's job, resume from Tune's checkpoint (its
    own after a restart, a donor's after a PBT exploit), train and report. ``settings``:
    every trial's run settings (the trial sets its directories and checkpoints)."""
    job = make_job(dict(config))
    every, keep = checkpoint_plan(job.steps)
    trial_dir = Path(tune.get_context().get_trial_dir())
    given = tune.get_checkpoint()
    resume: bool | Path = False
    resumed_from = 0
    # Each (re)start writes its own checkpoints, so a donor's are never overwritten.
    attempt = sum(1 for p in trial_dir.glob("run-*")) if trial_dir.is_dir() else 0
    run_dir = trial_dir / f"run-{attempt}"
    if given is not None:
        local = run_dir / "restored"
        given.to_directory(str(local))
        resume = local
        resumed_from = read_checkpoint(local).step
    fit(
        job,
        settings,
        run_dir=run_dir,
        checkpoint_dir=run_dir / "checkpoints",
        checkpoint_every=every,
        keep_checkpoints=keep,
        resume=resume,
        callbacks=[_ReportToTune(run_dir / "checkpoints", resumed_from, job.steps)],
    )
