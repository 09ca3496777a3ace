"""What a worker's training reports and is told, as plain records (no torch): a step's
measurements, the checkpoint policy, the run's outcome. The driver (controller, metrics)
reads them without importing the runtime's parallel machinery (DTensor and the rest:
about 0.5 s of a run's start)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from unipar.adapt.state import AdaptStats


@dataclass(frozen=True)
class StepReport:
    """What one worker measured in one optimizer step."""

    step: int
    rank: int
    loss: float | None  # None where this rank computes no loss (early pipeline stages)
    samples: int
    tokens: int
    seconds: float
    lr: float
    finished_at: float  # wall clock (time.time()) when the step ended on this worker
    sample_ids: tuple[int, ...] = ()  # dataset indices this rank counted in ``samples``
    adapt: AdaptStats | None = None  # the adaptive batch's figures (job.adaptive set)


@dataclass(frozen=True)
class CheckpointPolicy:
    directory: Path
    every: int
    keep: int


@dataclass(frozen=True)
class TrainOutcome:
    last_step: int
    final_checkpoint: Path | None
