"""A traced run's records as ``trace.json`` (Chrome trace format, opens in Perfetto), the
measured timeline under the predicted one (``timeline.png``), and the measured vs
predicted summary per component."""

from __future__ import annotations

import functools
import json
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from unipar.analysis.profile import ModelProfile
from unipar.cluster.spec import ClusterSpec
from unipar.errors import ConfigError
from unipar.plan.predict import estimate_plan
from unipar.plan.representation import Plan
from unipar.plan.strategy_search import Candidate
from unipar.viz.draw import draw_timelines
from unipar.viz.records import TracedAction, TraceRecord
from unipar.viz.timeline import Block, BlockKind, Timeline, predicted_timeline

_KINDS = {
    TracedAction.FORWARD: BlockKind.FORWARD,
    TracedAction.BACKWARD: BlockKind.BACKWARD,
    TracedAction.GRAD_SYNC: BlockKind.GRAD_SYNC,
    TracedAction.OPTIMIZER: BlockKind.OPTIMIZER,
}
COMPONENTS = (BlockKind.FORWARD, BlockKind.BACKWARD, BlockKind.GRAD_SYNC, BlockKind.OPTIMIZER)


def measured_timelines(records: Sequence[TraceRecord], pp: int, stages: int) -> list[Timeline]:
    """One timeline per traced step, times in seconds from the step's first start."""
    if not records:
        raise ConfigError("the trace holds no records: no traced step ran on any rank")
    timelines = []
    for step in sorted({r.step for r in records}):
        mine = [r for r in records if r.step == step]
        origin = min(r.start_ns for r in mine)
        blocks = tuple(
            Block(
                r.rank,
                r.stage,
                _KINDS[r.action],
                r.microbatch,
                (r.start_ns - origin) / 1e9,
                (r.end_ns - origin) / 1e9,
            )
            for r in sorted(mine, key=lambda r: r.start_ns)
        )
        timelines.append(Timeline(f"measured, step {step}", pp, stages, blocks))
    return timelines


def chrome_trace(records: Sequence[TraceRecord]) -> dict:
    """Chrome trace event format: complete events ("ph": "X"), microseconds, one process
    per pipeline rank and one thread per stage."""
    origin = min((r.start_ns for r in records), default=0)
    events = [
        {
            "name": f"{r.action.value}"
            + (f" mb{r.microbatch}" if r.microbatch is not None else ""),
            "cat": r.action.value,
            "ph": "X",
            "ts": (r.start_ns - origin) / 1e3,
            "dur": (r.end_ns - r.start_ns) / 1e3,
            "pid": r.rank,
            "tid": r.stage,
            "args": {"step": r.step, "microbatch": r.microbatch, "stage": r.stage},
        }
        for r in records
    ]
    names = [
        {"name": "process_name", "ph": "M", "pid": rank, "args": {"name": f"rank {rank}"}}
        for rank in sorted({r.rank for r in records})
    ]
    return {"traceEvents": names + events, "displayTimeUnit": "ms"}


IDLE_SHARE = "idle share"


@dataclass(frozen=True)
class ComponentError:
    name: str
    measured_s: float
    predicted_s: float

    @property
    def is_share(self) -> bool:
        """A fraction of the step (the idle share), not seconds."""
        return self.name == IDLE_SHARE

    @property
    def relative_error(self) -> float | None:
        """``None`` where nothing was predicted (below a nanosecond, or a share: a share's
        error is its difference in points, :meth:`summary_text`)."""
        if self.is_share or abs(self.predicted_s) < 1e-9:
            return None
        return (self.measured_s - self.predicted_s) / self.predicted_s


def _per_rank_seconds(timeline: Timeline, kind: BlockKind) -> float:
    """Seconds of ``kind`` per step, averaged over ranks."""
    return sum(b.seconds for b in timeline.blocks if b.kind is kind) / timeline.pp


def compare(measured: Sequence[Timeline], predicted: Timeline) -> list[ComponentError]:
    """Measured (the median over the traced steps: one slow step of a shared machine does
    not move it) vs predicted: each component's seconds per rank and step, the idle
    (bubble) share and the step time."""

    def idle(timeline: Timeline) -> float:
        return sum(timeline.bubble_share(r) for r in range(timeline.pp)) / timeline.pp

    measures: list[tuple[str, Callable[[Timeline], float]]] = [
        (kind.value, functools.partial(_per_rank_seconds, kind=kind)) for kind in COMPONENTS
    ]
    measures += [(IDLE_SHARE, idle), ("step", lambda t: t.step_s)]
    return [
        ComponentError(name, statistics.median(f(t) for t in measured), f(predicted))
        for name, f in measures
    ]


def summary_text(rows: Sequence[ComponentError]) -> str:
    lines = [f"{'component':<12} {'measured':>12} {'predicted':>12} {'error':>8}"]
    for row in rows:
        if row.is_share:
            # a rounding residue of the predicted timeline can read -0.0%: shown as 0
            measured_share, predicted_share = (max(0.0, x) for x in (row.measured_s,
                                                                       row.predicted_s))
            measured = f"{100 * measured_share:.1f}%"
            predicted = f"{100 * predicted_share:.1f}%"
            error = f"{100 * (measured_share - predicted_share):+.1f} pt"
        else:
            measured = f"{1e3 * row.measured_s:.2f} ms"
            predicted = f"{1e3 * row.predicted_s:.2f} ms"
            error = "n/a" if row.relative_error is None else f"{100 * row.relative_error:+.0f}%"
        lines.append(f"{row.name:<12} {measured:>12} {predicted:>12} {error:>8}")
    return "\n".join(lines)


@dataclass(frozen=True)
class TraceOutputs:
    trace_json: Path
    timeline_png: Path | None
    summary: str  # measured vs predicted per component (or why nothing was predicted)
    records: tuple[TraceRecord, ...] = ()  # what the ranks measured

    def describe(self) -> str:
        """The run summary's lines about the trace."""
        files = [str(self.trace_json)] + ([str(self.timeline_png)] if self.timeline_png else [])
        lines = [f"  trace         {', '.join(files)}"]
        lines += [f"    {line}" for line in self.summary.splitlines()]
        return "\n".join(lines)


def write_trace(
    run_dir: str | Path,
    records: Sequence[TraceRecord],
    *,
    pp: int,
    stages: int,
    predicted: Timeline | None = None,
    draw: bool = True,
) -> TraceOutputs:
    """Write ``RUN_DIR/trace.json`` and (``draw``) ``RUN_DIR/timeline.png``: the last
    traced step measured, under the predicted one if given."""
    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    measured = measured_timelines(records, pp, stages)
    path = run_dir / "trace.json"
    path.write_text(json.dumps(chrome_trace(records)))
    summary = summary_text(compare(measured, predicted)) if predicted is not None else ""
    picture = None
    if draw:
        panels = [predicted, measured[-1]] if predicted is not None else [measured[-1]]
        picture = draw_timelines(panels, run_dir / "timeline.png")
    return TraceOutputs(path, picture, summary, tuple(records))


def predicted_run_timeline(profile: ModelProfile, plan: Plan, cluster: ClusterSpec) -> Timeline:
    """The cost model's timeline of ``plan`` for a model of ``profile`` on ``cluster``."""
    estimate = estimate_plan(profile, plan, cluster)
    return predicted_timeline(Candidate(plan, estimate), profile, cluster, "predicted")
