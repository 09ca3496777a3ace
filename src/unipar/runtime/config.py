"""Settings of one run: where, on how many workers, how it checkpoints and recovers."""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

from unipar.errors import ConfigError


@dataclass(frozen=True)
class RunConfig:
    """How to run a job. ``resume`` is ``False``, ``True`` (the newest checkpoint in
    ``checkpoint_dir``) or the path of a checkpoint or checkpoint directory."""

    workers: int = 2  # the most workers (the number to start with when the cluster has room)
    min_workers: int | None = None  # the fewest to train on (None: ``workers``, a fixed size)
    elastic: bool = True  # live recovery and resizing; False: restart from disk on a loss
    # In-memory snapshots every this many steps (None: none for replicated state, else as
    # often as 2% of the training time allows).
    snapshot_every: int | None = None
    cpus_per_worker: float = 1.0
    gpus_per_worker: float = 0.0
    run_dir: Path = Path("unipar_runs")
    checkpoint_dir: Path | None = None
    checkpoint_every: int | None = None
    keep_checkpoints: int = 3
    resume: bool | Path = False
    max_failures: int = 3
    address: str | None = None
    progress: bool = True
    placement_timeout_s: float = 60.0
    collective_timeout_s: float = 300.0
    # The controller takes in step reports at most this often (it shares the workers'
    # cores); a lost worker is still seen within this interval.
    poll_interval_s: float = 0.5

    def __post_init__(self) -> None:
        rules = [
            (self.workers >= 1, f"workers must be >= 1, but got {self.workers}"),
            (
                1 <= self.least_workers <= self.workers,
                f"the least number of workers must be between 1 and the most, but got "
                f"min={self.least_workers} and max={self.workers}; use e.g. workers=("
                f"{min(max(1, self.least_workers), self.workers)}, {self.workers})",
            ),
            (
                self.elastic or self.least_workers == self.workers,
                f"a worker range ({self.least_workers}..{self.workers}) needs elastic=True",
            ),
            (
                self.snapshot_every is None or self.snapshot_every >= 0,
                f"snapshot_every must be >= 0 steps, but got {self.snapshot_every}",
            ),
            (
                self.cpus_per_worker > 0 or self.gpus_per_worker > 0,
                "a worker needs a CPU or a GPU, but got cpus_per_worker="
                f"{self.cpus_per_worker}, gpus_per_worker={self.gpus_per_worker}",
            ),
            (
                self.keep_checkpoints >= 1,
                f"keep_checkpoints must be >= 1, but got {self.keep_checkpoints}",
            ),
            (self.max_failures >= 0, f"max_failures must be >= 0, but got {self.max_failures}"),
            (
                self.checkpoint_every is None or self.checkpoint_every >= 1,
                f"checkpoint_every must be >= 1 step, but got {self.checkpoint_every}",
            ),
        ]
        for holds, message in rules:
            if not holds:
                raise ConfigError(message)

    @property
    def least_workers(self) -> int:
        return self.workers if self.min_workers is None else self.min_workers

    @property
    def checkpoints(self) -> Path:
        return (
            Path(self.checkpoint_dir) if self.checkpoint_dir else Path(self.run_dir) / "checkpoints"
        )

    def checkpoint_interval(self, steps: int) -> int:
        """Default: ten checkpoints over the run."""
        return self.checkpoint_every or max(1, steps // 10)


def default_run_dir(job_name: str, root: Path = Path("unipar_runs")) -> Path:
    return root / f"{job_name}-{time.strftime('%Y%m%d-%H%M%S')}"
