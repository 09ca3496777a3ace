"""``unipar plan --plot DIR`` / ``plot_plan(report, DIR)``: timeline, memory and breakdown
pictures of the planner's choice and its alternatives."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from unipar.errors import ConfigError
from unipar.plan.explain import describe
from unipar.viz.bars import MEMORY_PARTS, TIME_PARTS, memory_bars, time_bars
from unipar.viz.draw import draw_bars, draw_timelines, pyplot
from unipar.viz.timeline import Timeline, predicted_timeline

if TYPE_CHECKING:
    from unipar.plan.report import PlanReport


@dataclass(frozen=True)
class PlanPictures:
    timeline: Path
    memory: Path
    breakdown: Path


def output_directory(directory: str | Path) -> Path:
    """``directory``, created if missing; a clear error if it is a file or cannot be made."""
    path = Path(directory)
    if path.exists() and not path.is_dir():
        raise ConfigError(
            f"pictures are written into a directory, but {path} is a file; "
            "pass a directory (it is created if missing)"
        )
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise ConfigError(
            f"cannot create the picture directory {path} ({error.strerror or error}); "
            "pass a writable directory"
        ) from error
    return path


def plan_timelines(report: PlanReport) -> list[Timeline]:
    """Predicted timelines of the chosen plan and the runner-up (if any)."""
    chosen = report.result.ranked[:2]
    names = ["chosen", "runner-up"]
    return [
        predicted_timeline(c, report.profile, report.cluster, f"{name}: {describe(c)}")
        for name, c in zip(names, chosen, strict=False)
    ]


def plot_plan(report: PlanReport, directory: str | Path) -> PlanPictures:
    """Write ``timeline.png``, ``memory.png`` and ``breakdown.png`` into ``directory``
    (a path; needs ``pip install unipar[plot]``); returns their paths."""
    pyplot()  # the missing-extra error before anything is computed or written
    path = output_directory(directory)
    device = report.cluster.device
    return PlanPictures(
        timeline=draw_timelines(plan_timelines(report), path / "timeline.png"),
        memory=draw_bars(
            memory_bars(report.result),
            MEMORY_PARTS,
            path / "memory.png",
            unit_label="GiB per device (the rank needing most)",
            title=f"memory per device on {device.name}: top plans and the closest rejected",
            capacity=device.memory_gib,
        ),
        breakdown=draw_bars(
            time_bars(report.result),
            TIME_PARTS,
            path / "breakdown.png",
            unit_label="seconds per step",
            title="where the step time goes: top plans",
        ),
    )
