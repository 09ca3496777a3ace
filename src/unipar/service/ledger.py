"""What a job's runner counts of its steps for the scheduler (pure, no Ray).

Progress is counted in steps of the job's global batch M0, as the job's own end is: one per
step for a fixed batch, the scale-invariant progress for an adaptive batch (Pollux §3.1: a
step of batch M counts its gain over a step of M0, AdaScale's r = S·E with S = M/M0). The
seconds per step reported at each worker count are therefore seconds per step of M0's
progress: for an adaptive job, whose runtime picks its batch at each size, the inverse of
its measured goodput (throughput × statistical efficiency, Pollux eq. 1), and for a fixed
batch the plain step time.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Any

WARMUP_STEPS = 2  # steps after each (re)formation left out of the step times


@dataclass
class RunnerStatus:
    """What the runner reports to the scheduler."""

    state: str = "running"  # running, done, failed
    step: int = 0  # steps of batch M0 done (an adaptive job's progress, rounded down)
    workers: int = 0
    # workers -> (steps of M0's progress, seconds) over the steps timed at that size
    step_times: dict[int, tuple[float, float]] = field(default_factory=dict)
    steps_per_s: float = 0.0  # steps of M0's progress per second at the present size
    batch: int = 0  # the global batch of the last step
    resizes: list[str] = field(default_factory=list)
    error: str = ""
    summary: str = ""
    # what its resizes cost: seconds from a raised target to the gang running at it (new
    # workers start meanwhile), and seconds without a step while the gang re-formed
    grow_latency_s: list[float] = field(default_factory=list)
    pause_s: list[float] = field(default_factory=list)
    # on a cluster of several node types: the type its workers hold (from the resources
    # Ray assigned them), step_times per type, and (first step, type) at each change
    gpu_type: str = ""
    typed_step_times: dict[str, dict[int, tuple[float, float]]] = field(default_factory=dict)
    placements: list[tuple[int, str]] = field(default_factory=list)
    # an adaptive job's gradient statistics (smoothed |G|² and tr(Σ) per sample, as its
    # runtime estimates them) and its optimizer steps at each shape it ran: (workers,
    # micro-batch, micro-batches per worker) -> (steps, seconds), the step times of the
    # batches actually run (what the scheduler fits Pollux's throughput model on)
    grad_sqr: float = 0.0
    grad_var: float = 0.0
    batch_times: dict[tuple[int, int, int], tuple[float, float]] = field(default_factory=dict)

    def copy(self) -> RunnerStatus:
        return copy.deepcopy(self)


@dataclass
class StepLedger:
    """Fills ``status`` from the controller's step and resize events (the runner holds
    it under its lock). ``batch``: the job's global batch M0."""

    status: RunnerStatus
    batch: int
    since_formed: int = 0  # steps since the gang last (re)formed
    last_step_at: float | None = None  # unix time the last step finished
    paused_since: float | None = None  # ... the last step before a resize

    def step(self, metrics: Any, size: int, gpu_type: str = "") -> None:
        """One ``StepMetrics`` on ``size`` workers holding node type ``gpu_type`` ("": a
        cluster without types)."""
        s = self.status
        if size != s.workers or gpu_type != s.gpu_type:
            self.since_formed = 0
        if gpu_type and (not s.placements or s.placements[-1][1] != gpu_type):
            s.placements.append((metrics.step, gpu_type))
        s.gpu_type = gpu_type
        if self.paused_since is not None:
            began = metrics.finished_at - metrics.step_time_s
            s.pause_s.append(max(0.0, began - self.paused_since))
            self.paused_since = None
        self.last_step_at = metrics.finished_at
        self.since_formed += 1
        s.workers = size
        adapt = metrics.adapt
        if adapt is None:
            units, s.step, s.batch = 1.0, metrics.step + 1, self.batch
        else:  # its stats hold the progress before it and its efficiency E = r/S
            units = adapt.efficiency * adapt.global_batch / self.batch
            s.step, s.batch = int(adapt.progress + units), adapt.global_batch
            if adapt.grad_sqr > 0:
                s.grad_sqr, s.grad_var = adapt.grad_sqr, adapt.grad_var
            if self.since_formed > WARMUP_STEPS and adapt.micro > 0:
                shape = (size, adapt.micro, adapt.accum)
                n, sec = s.batch_times.get(shape, (0.0, 0.0))
                s.batch_times[shape] = (n + 1, sec + metrics.step_time_s)
        self._count(size, units, metrics.step_time_s, self.since_formed > WARMUP_STEPS)

    def _count(self, size: int, units: float, seconds: float, timed: bool) -> None:
        """``units`` steps of M0's progress made in ``seconds`` on ``size`` workers (the
        present size: its speed is the status's)."""
        if not timed or units <= 0:
            return
        s = self.status
        tables = [s.step_times]
        if s.gpu_type:  # and apart for its type: its present speed is that type's
            tables.append(s.typed_step_times.setdefault(s.gpu_type, {}))
        for table in tables:
            n, sec = table.get(size, (0.0, 0.0))
            table[size] = (n + units, sec + seconds)
        n, sec = tables[-1][size]
        s.steps_per_s = n / max(sec, 1e-9)

    def resized(self) -> None:
        """The gang re-forms: the next steps warm up, the pause is timed from the last."""
        self.since_formed = 0
        self.paused_since = self.last_step_at
