"""Every run checks the planner: the prediction of each plan it trains under, the step
time it measures in its steady state, the error, and a record of both for the planner
to learn from (:mod:`unipar.cluster.run_records`, :mod:`unipar.cluster.learned_fit`).

On the driver, :class:`RunLearner` is told of each formation's plan by the controller
(:meth:`RunLearner.predict`, whose answer each step's metrics carry), follows the steps
as a callback, and when the formation ends (a resize, or the run's end) compares the
median of its steady steps (after the warm-up) with the prediction and stores the
record. A traced formation (the run's last steps: every run long enough traces a few,
:func:`~unipar.runtime.tracing.steps_traced`) adds its forward and optimizer times.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from unipar.analysis.profile import ModelProfile
from unipar.cluster.run_records import (
    RunRecord,
    fingerprint,
    machine_load,
    store_record,
)
from unipar.plan import Plan
from unipar.plan.explain import describe
from unipar.plan.predict import MeasuredTimes, estimate_plan, observations
from unipar.ray_cluster.live import live_cluster_spec
from unipar.runtime.callbacks import Callback
from unipar.runtime.metrics import StepMetrics
from unipar.runtime.tracing import TracedAction, TraceRecord

if TYPE_CHECKING:
    from unipar.cluster.spec import ClusterSpec
    from unipar.runtime.preflight import Preflight

WARMUP_SHARE = 0.1  # the first 10% of a formation's steps (at least MIN_WARMUP) warm up
MIN_WARMUP = 2
MIN_MEASURED = 3  # steady steps to state a measured step time
MIN_LEARNED = 10  # steady steps for a record the planner learns from


@dataclass(frozen=True)
class PredictionCheck:
    """One formation's prediction against its measurement. ``predicted_s`` ``None``:
    not predicted (``note`` says why); ``measured_s`` ``None``: too few steady steps.
    ``steps``: the steady steps measured (first, last); ``corrections``: how the
    prediction was corrected by earlier runs ("" where it was not); ``learned``: what
    became of the record."""

    workers: int
    plan: str
    predicted_s: float | None
    measured_s: float | None
    steps: tuple[int, int] | None
    corrections: str = ""
    learned: str = ""
    note: str = ""

    @property
    def error(self) -> float | None:
        """Predicted over measured, minus one."""
        if not self.predicted_s or not self.measured_s:
            return None
        return self.predicted_s / self.measured_s - 1

    def lines(self, with_workers: bool) -> list[str]:
        """The run summary's lines for this formation."""
        head = "  step time     " + (f"{self.workers} workers: " if with_workers else "")
        if self.predicted_s is None:
            return [f"{head}not predicted ({self.note})"]
        predicted = f"predicted {self.predicted_s:.3f} s"
        if self.measured_s is None or self.steps is None:
            return [f"{head}{predicted}; too few steady steps to measure"]
        first, last = self.steps
        error = self.error
        assert error is not None
        lines = [
            f"{head}measured {self.measured_s:.3f} s (median of steps {first}-{last}) "
            f"against {predicted}: error {error:+.1%}"
        ]
        lines += [f"{'':16s}{text}" for text in (self.corrections, self.learned) if text]
        return lines


def summary_lines(checks: Sequence[PredictionCheck]) -> list[str]:
    """The run summary's lines of every formation."""
    sizes = {check.workers for check in checks}
    return [line for check in checks for line in check.lines(len(sizes) > 1)]


@dataclass
class _Formation:
    plan: Plan
    cluster: ClusterSpec | None
    predicted_s: float | None
    note: str = ""
    steps: list[StepMetrics] = field(default_factory=list)


class RunLearner(Callback):
    """The driver's side of a run's prediction check (module doc). ``directory``: where
    records go (default ``~/.cache/unipar``)."""

    def __init__(self, pre: Preflight, *, directory: Path | None = None):
        self.pre, self.directory = pre, directory
        self.checks: list[PredictionCheck] = []
        self._formation: _Formation | None = None
        # the cluster the newest formation was predicted on, before any record of its own
        # (None: not predicted)
        self.predicted_on: ClusterSpec | None = None

    def predict(self, plan: Plan) -> float | None:
        """The prediction of ``plan`` on the connected cluster, as a formation starts
        under it (the previous formation, if any, ended untraced)."""
        self._close(())
        self.predicted_on = None
        config = self.pre.config
        job = self.pre.job
        if job.adaptive is not None:
            self._formation = _Formation(plan, None, None, "an adaptive batch changes the step")
            return None
        if job.steps < MIN_WARMUP + MIN_MEASURED:  # nothing to compare: no analysis made
            why = f"{job.steps} steps hold no steady state to measure: at least "
            self._formation = _Formation(plan, None, None, why + str(MIN_WARMUP + MIN_MEASURED))
            return None
        try:
            cluster = live_cluster_spec(
                plan.mesh.world_size,
                cpus_per_worker=config.cpus_per_worker,
                gpus_per_worker=config.gpus_per_worker,
            )
            predicted = estimate_plan(self.pre.facts.profile, plan, cluster).step_time_s
        except Exception as error:  # an arbitrary model the analysis cannot take: say so
            self._formation = _Formation(plan, None, None, f"{type(error).__name__}: {error}")
            return None
        self._formation = _Formation(plan, cluster, predicted)
        self.predicted_on = cluster
        return predicted

    def on_step(self, metrics: StepMetrics, workers: Sequence[Any]) -> None:
        if self._formation is not None:
            self._formation.steps.append(metrics)

    def on_resize(self, event: Any) -> None:
        self._close(())

    def finish(self, trace: Sequence[TraceRecord]) -> tuple[PredictionCheck, ...]:
        """The run's checks, the last formation's with its traced steps."""
        self._close(trace)
        return tuple(self.checks)

    def _close(self, trace: Sequence[TraceRecord]) -> None:
        formation, self._formation = self._formation, None
        if formation is None or not formation.steps:
            return
        plan = formation.plan
        steady = steady_steps(formation.steps)
        measured = statistics.median(m.step_time_s for m in steady) if steady else None
        span = (steady[0].step, steady[-1].step) if steady else None
        enough = len(steady) >= MIN_MEASURED
        check = PredictionCheck(
            workers=plan.mesh.world_size,
            plan=describe(plan),
            predicted_s=formation.predicted_s,
            measured_s=measured if enough else None,
            steps=span if enough else None,
            note=formation.note,
        )
        cluster = formation.cluster
        if cluster is not None:
            corrections = cluster.corrections
            described = corrections.describe() if corrections is not None else ""
            learned = ""
            if measured is not None:
                try:
                    learned = self._store(formation, cluster, measured, steady, trace)
                except Exception as error:  # learning never costs a finished run its result
                    learned = f"not learned from: {type(error).__name__}: {error}"
            check = replace(check, corrections=described, learned=learned)
        self.checks.append(check)

    def _store(
        self,
        formation: _Formation,
        cluster: ClusterSpec,
        measured: float,
        steady: list[StepMetrics],
        trace: Sequence[TraceRecord],
    ) -> str:
        """Store the formation's record; what became of it, for the summary."""
        if len(steady) < MIN_LEARNED:
            return f"not learned from: {len(steady)} steady steps (at least {MIN_LEARNED})"
        assert formation.predicted_s is not None
        record = run_record(
            self.pre.facts.profile,
            formation.plan,
            cluster,
            job=self.pre.job.name,
            steps=len(steady),
            predicted_s=formation.predicted_s,
            times=measured_times(measured, trace, formation.plan.mesh.pp),
            finished_at=steady[-1].finished_at,
        )
        path = store_record(record, self.directory)
        if path is None:
            return "not learned from: the cache directory cannot be written"
        if record.overloaded:
            return (
                f"kept apart, not learned from: the machine was overloaded (load average "
                f"{record.load_average:.1f} on {record.cpus} cores); records in {path.parent}"
            )
        return (
            f"learned for the next plan on this cluster ({record.cluster_label}); "
            f"records in {path.parent}"
        )


def run_record(
    profile: ModelProfile,
    plan: Plan,
    cluster: ClusterSpec,
    *,
    job: str,
    steps: int,
    predicted_s: float,
    times: MeasuredTimes,
    finished_at: float,
) -> RunRecord:
    """The record of ``steps`` steady steps of ``plan`` on ``cluster`` (as specified or
    corrected: the record is of its fingerprint, its shares of the uncorrected model)
    that measured ``times`` against ``predicted_s``, with this machine's load now."""
    load, cpus = machine_load()
    print_ = fingerprint(cluster)
    return RunRecord(
        cluster=print_.key,
        cluster_label=print_.label,
        finished_at=finished_at,
        job=job,
        plan=describe(plan),
        workers=plan.mesh.world_size,
        steps=steps,
        predicted_s=predicted_s,
        measured_s=times.step_s,
        load_average=load,
        cpus=cpus,
        observations=observations(profile, plan, cluster, times),
    )


def measured_times(step_s: float, trace: Sequence[TraceRecord], pp: int) -> MeasuredTimes:
    """The step measured, with the forward and optimizer times of the traced steps."""
    return MeasuredTimes(
        step_s=step_s,
        forward_s=per_rank_median(trace, TracedAction.FORWARD, pp),
        optimizer_s=per_rank_median(trace, TracedAction.OPTIMIZER, pp),
    )


def steady_steps(steps: Sequence[StepMetrics]) -> list[StepMetrics]:
    """The steps of one formation after its warm-up: in each attempt (a restart begins
    anew) the first :data:`WARMUP_SHARE` of its steps, at least :data:`MIN_WARMUP`,
    are left out, and so are partial steps (a rank died after them)."""
    by_attempt: dict[int, list[StepMetrics]] = {}
    for metrics in sorted(steps, key=lambda m: (m.attempt, m.step)):
        by_attempt.setdefault(metrics.attempt, []).append(metrics)
    steady = []
    for run in by_attempt.values():
        warmup = max(MIN_WARMUP, math.ceil(WARMUP_SHARE * len(run)))
        steady += [m for m in run[warmup:] if not m.partial]
    return sorted(steady, key=lambda m: m.step)


def per_rank_median(
    trace: Sequence[TraceRecord], action: TracedAction, pp: int
) -> float | None:
    """Seconds of ``action`` per step on a pipeline rank (their sum over ranks over
    ``pp``), the median over the traced steps; ``None`` where none was traced."""
    by_step: dict[int, float] = {}
    for record in trace:
        if record.action is action:
            by_step[record.step] = by_step.get(record.step, 0.0) + (
                record.end_ns - record.start_ns
            ) / 1e9
    if not by_step:
        return None
    return statistics.median(seconds / pp for seconds in by_step.values())
