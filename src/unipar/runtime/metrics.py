"""Per-step metrics: gathered from workers, written as JSONL (and to TensorBoard)."""

from __future__ import annotations

import json
from collections import defaultdict
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from unipar.adapt.state import AdaptStats
from unipar.runtime.step_records import StepReport

# The adaptive batch's figures drawn and logged over a run.
ADAPT_CURVES = ("global_batch", "noise_scale", "efficiency", "goodput")


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
    # Dataset indices of the step's samples (not written to metrics.jsonl).
    sample_ids: tuple[int, ...] = field(default=(), repr=False)
    # Some rank committed the step and died before its report arrived: loss, samples and
    # tokens are the reporting ranks' only.
    partial: bool = False
    # The adaptive batch's figures (a job with ``adaptive``), the same on every rank.
    adapt: AdaptStats | None = None
    # The cost model's step time for the plan this step ran under (None: not predicted).
    predicted_step_s: float | None = None


class StepAggregator:
    """Joins the workers' reports of each step into one :class:`StepMetrics`, with the
    prediction of the plan they ran under (``predicted_step_s``)."""

    def __init__(self, world_size: int, predicted_step_s: float | None = None) -> None:
        self.world_size = world_size
        self.predicted_step_s = predicted_step_s
        self._pending: dict[int, list[StepReport]] = defaultdict(list)

    def add(self, reports: list[StepReport], attempt: int) -> list[StepMetrics]:
        complete = []
        for report in reports:
            self._pending[report.step].append(report)
            group = self._pending[report.step]
            if len(group) == self.world_size:
                del self._pending[report.step]
                complete.append(_joined(group, attempt, self.predicted_step_s))
        return sorted(complete, key=lambda m: m.step)

    def flush_below(self, step: int, attempt: int) -> list[StepMetrics]:
        """The incomplete steps before ``step`` from the reports that arrived (some rank
        committed them and then died before reporting)."""
        done = [s for s in self._pending if s < step]
        predicted = self.predicted_step_s
        complete = [
            _joined(self._pending.pop(s), attempt, predicted, partial=True) for s in sorted(done)
        ]
        self._pending.clear()
        return complete

    def reset(self) -> None:
        self._pending.clear()


def _joined(
    group: list[StepReport], attempt: int, predicted: float | None, *, partial: bool = False
) -> StepMetrics:
    seconds = max(r.seconds for r in group)
    tokens = sum(r.tokens for r in group)
    return StepMetrics(
        step=group[0].step,
        loss=_mean([r.loss for r in group if r.loss is not None]),
        lr=group[0].lr,
        samples=sum(r.samples for r in group),
        tokens=tokens,
        step_time_s=seconds,
        tokens_per_s=tokens / seconds if seconds else 0.0,
        attempt=attempt,
        finished_at=max(r.finished_at for r in group),
        sample_ids=tuple(i for r in sorted(group, key=lambda r: r.rank) for i in r.sample_ids),
        partial=partial,
        adapt=group[0].adapt,
        predicted_step_s=predicted,
    )


def _mean(values: list[float]) -> float:
    return sum(values) / len(values) if values else float("nan")


class MetricsWriter:
    """Appends one JSON object per step to ``path``; mirrors to TensorBoard if installed."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._file: Any = None
        self._tensorboard: Any = None

    def _open(self) -> None:
        if self._file is None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._file = open(self.path, "a")  # noqa: SIM115 (closed in close())
            self._tensorboard = _tensorboard_writer(self.path.parent / "tensorboard")

    def write(self, metrics: StepMetrics) -> None:
        self._open()
        record = asdict(metrics)
        del record["sample_ids"]
        self._file.write(json.dumps(record) + "\n")
        self._file.flush()
        if self._tensorboard is not None:
            for name in ("loss", "lr", "tokens_per_s", "step_time_s"):
                self._tensorboard.add_scalar(name, getattr(metrics, name), metrics.step)
            if metrics.predicted_step_s is not None:
                self._tensorboard.add_scalar(
                    "predicted_step_s", metrics.predicted_step_s, metrics.step
                )
            if metrics.adapt is not None:
                for name in ADAPT_CURVES:
                    value = getattr(metrics.adapt, name)
                    self._tensorboard.add_scalar(f"adaptive/{name}", value, metrics.step)

    def write_event(self, record: dict[str, Any]) -> None:
        """An event of the run (``{"event": "resize", "step": ..., "new": ...}``); in
        TensorBoard the number of workers over the steps."""
        self._open()
        self._file.write(json.dumps(record) + "\n")
        self._file.flush()
        if self._tensorboard is not None and "new" in record:
            self._tensorboard.add_scalar("workers", record["new"], record["step"])

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
        if self._tensorboard is not None:
            self._tensorboard.close()


def _tensorboard_writer(directory: Path) -> Any:
    try:
        from torch.utils.tensorboard import SummaryWriter  # noqa: PLC0415 (optional: tensorboard)
    except ImportError:  # tensorboard is optional: pip install tensorboard
        return None
    return SummaryWriter(log_dir=str(directory))


def read_metrics(path: Path) -> list[dict[str, Any]]:
    """The metrics file's step records, the last one of each step (a restart repeats
    steps); event records (resizes) are left out: :func:`read_events` has them."""
    by_step: dict[int, dict[str, Any]] = {}
    for line in Path(path).read_text().splitlines():
        record = json.loads(line)
        if "event" not in record:
            by_step[record["step"]] = record
    return [by_step[s] for s in sorted(by_step)]


def read_events(path: Path) -> list[dict[str, Any]]:
    """The metrics file's event records (resizes), in order."""
    records = (json.loads(line) for line in Path(path).read_text().splitlines())
    return [record for record in records if "event" in record]
