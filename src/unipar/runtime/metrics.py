"""Per-step metrics: gathered from workers, written as JSONL (and to TensorBoard)."""

from __future__ import annotations

import json
from collections import defaultdict
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from unipar.runtime.trainer import StepReport


@dataclass(frozen=True)
class StepMetrics:
    """One optimizer step over all workers."""

    step: int
    loss: float
    lr: float
    samples: int
    tokens: int
    step_time_s: float
    tokens_per_s: float
    attempt: int
    finished_at: float


class StepAggregator:
    """Joins the workers' reports of each step into one :class:`StepMetrics`."""

    def __init__(self, world_size: int) -> None:
        self.world_size = world_size
        self._pending: dict[int, list[StepReport]] = defaultdict(list)

    def add(self, reports: list[StepReport], attempt: int) -> list[StepMetrics]:
        complete = []
        for report in reports:
            self._pending[report.step].append(report)
            group = self._pending[report.step]
            if len(group) == self.world_size:
                del self._pending[report.step]
                seconds = max(r.seconds for r in group)
                tokens = sum(r.tokens for r in group)
                complete.append(
                    StepMetrics(
                        step=report.step,
                        loss=_mean([r.loss for r in group if r.loss is not None]),
                        lr=group[0].lr,
                        samples=sum(r.samples for r in group),
                        tokens=tokens,
                        step_time_s=seconds,
                        tokens_per_s=tokens / seconds if seconds else 0.0,
                        attempt=attempt,
                        finished_at=max(r.finished_at for r in group),
                    )
                )
        return sorted(complete, key=lambda m: m.step)

    def reset(self) -> None:
        self._pending.clear()


def _mean(values: list[float]) -> float:
    return sum(values) / len(values) if values else float("nan")


class MetricsWriter:
    """Appends one JSON object per step to ``path``; mirrors to TensorBoard if installed."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._file: Any = None
        self._tensorboard: Any = None

    def write(self, metrics: StepMetrics) -> None:
        if self._file is None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._file = open(self.path, "a")  # noqa: SIM115 (closed in close())
            self._tensorboard = _tensorboard_writer(self.path.parent / "tensorboard")
        self._file.write(json.dumps(asdict(metrics)) + "\n")
        self._file.flush()
        if self._tensorboard is not None:
            for name in ("loss", "lr", "tokens_per_s"):
                self._tensorboard.add_scalar(name, getattr(metrics, name), metrics.step)

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
        if self._tensorboard is not None:
            self._tensorboard.close()


def _tensorboard_writer(directory: Path) -> Any:
    try:
        from torch.utils.tensorboard import SummaryWriter
    except ImportError:  # tensorboard is optional: pip install tensorboard
        return None
    return SummaryWriter(log_dir=str(directory))


def read_metrics(path: Path) -> list[dict[str, Any]]:
    """The metrics file's records, the last one of each step (a restart repeats steps)."""
    by_step: dict[int, dict[str, Any]] = {}
    for line in Path(path).read_text().splitlines():
        record = json.loads(line)
        by_step[record["step"]] = record
    return [by_step[s] for s in sorted(by_step)]
