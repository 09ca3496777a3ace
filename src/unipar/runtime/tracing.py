"""Measured step timelines: when each micro-batch's forward and backward, the gradient
sync and the optimizer start and end on each rank. No Ray, no drawing here
(:mod:`unipar.viz.trace` turns the records, :mod:`unipar.viz.records`, into
``trace.json`` and pictures).

Off by default, and then it costs nothing: nothing is wrapped or hooked, the training
code holds ``None`` instead of a tracer. On, it wraps this rank's own pipeline stage
objects (``forward_one_chunk`` / ``backward_one_chunk`` / ``perform_reduce_grad``, the
calls torch's schedules make for each action, with the micro-batch index as first
argument) and hooks the optimizers (``register_step_pre_hook`` / ``post_hook``).
Timestamps: ``time.perf_counter_ns`` (CLOCK_MONOTONIC, one clock for all processes of a
node) on CPU; on GPU, CUDA events around each span, resolved once the step is over.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from unipar.errors import ConfigError
from unipar.viz.records import TracedAction, TraceRecord

# torch is imported where CUDA events are made: the command line checks --trace with
# traced_steps, which needs no torch.


def traced_steps(trace_steps: int, first_step: int, last_step: int) -> range:
    """The last ``trace_steps`` steps of a run going from ``first_step`` to ``last_step``
    (exclusive): steady steps, after the first one's warm-up where possible."""
    available = last_step - first_step
    if trace_steps < 1 or trace_steps > available:
        raise ConfigError(
            f"trace_steps (--trace) must be between 1 and the {available} step(s) the run "
            f"has (steps {first_step} to {last_step - 1}), but got {trace_steps}; trace "
            "fewer steps or run more"
        )
    return range(last_step - trace_steps, last_step)


@dataclass(frozen=True)
class TraceBatch:
    """One rank's records of the traced steps, sent to the driver once they are over."""

    records: tuple[TraceRecord, ...]


# Every run of at least LEARNING_MIN_STEPS steps traces its last LEARNING_TRACE_STEPS, so
# that the planner learns its forward and optimizer times (:mod:`unipar.runtime.learn`);
# nothing is written unless ``trace_steps`` asked for it.
LEARNING_TRACE_STEPS = 5
LEARNING_MIN_STEPS = 20


def steps_traced(trace_steps: int | None, job: Any) -> int | None:
    """How many of the last steps a run of ``job`` traces: ``trace_steps`` (``--trace``)
    if given; else :data:`LEARNING_TRACE_STEPS` where the run is long enough for the
    planner to learn from (:data:`LEARNING_MIN_STEPS`, a fixed batch); else none."""
    if trace_steps is not None:
        return trace_steps
    if job.adaptive is None and job.steps >= LEARNING_MIN_STEPS:
        return LEARNING_TRACE_STEPS
    return None


def trace_window(trace_steps: int | None, start: int, steps: int) -> range | None:
    """The steps a run from ``start`` to ``steps`` traces: the last ``trace_steps`` (fewer
    when a resumed or re-formed run has fewer left); ``None`` when tracing is off."""
    if trace_steps is None or start >= steps:
        return None
    return traced_steps(min(trace_steps, steps - start), start, steps)


def traces(coordinates: Any) -> bool:
    """Whether a rank at ``coordinates`` records: one per pipeline rank (the first data,
    tensor and context parallel rank); its peers run the same actions at the same
    times, so the others attach nothing and cost nothing."""
    return coordinates.dp == coordinates.fsdp == coordinates.tp == coordinates.cp == 0


class StepTracer:
    """Records this rank's spans during the steps in ``steps``.

    The caller marks steps with :meth:`begin_step` / :meth:`end_step`; spans outside a
    traced step are not recorded."""

    def __init__(self, rank: int, steps: range, device: Any = None) -> None:
        self.rank, self.steps = rank, steps
        self.records: list[TraceRecord] = []
        self.step: int | None = None
        self._cuda = device is not None and getattr(device, "type", None) == "cuda"
        self._pending: list[tuple[Any, Any, int, TracedAction, int | None]] = []

    @property
    def recording(self) -> bool:
        return self.step is not None

    def begin_step(self, step: int) -> None:
        self.step = step if step in self.steps else None
        if self._cuda and self.recording:
            import torch  # noqa: PLC0415 (heavy: torch)

            self._anchor = torch.cuda.Event(enable_timing=True)
            self._anchor.record()
            self._anchor_ns = time.perf_counter_ns()

    def end_step(self) -> None:
        if self._cuda and self._pending:
            self._resolve_cuda()
        self.step = None

    def span(self, action: TracedAction, stage: int, microbatch: int | None = None) -> _Span:
        return _Span(self, action, stage, microbatch)

    def _start(self) -> Any:
        if self._cuda:
            import torch  # noqa: PLC0415 (heavy: torch)

            event = torch.cuda.Event(enable_timing=True)
            event.record()
            return event
        return time.perf_counter_ns()

    def _finish(self, started: Any, action: TracedAction, stage: int, mb: int | None) -> None:
        if self._cuda:
            import torch  # noqa: PLC0415 (heavy: torch)

            end = torch.cuda.Event(enable_timing=True)
            end.record()
            self._pending.append((started, end, stage, action, mb))
            return
        step = self.step
        assert step is not None
        end_ns = time.perf_counter_ns()
        self.records.append(TraceRecord(self.rank, stage, action, mb, step, started, end_ns))

    def _resolve_cuda(self) -> None:
        import torch  # noqa: PLC0415 (heavy: torch)

        torch.cuda.synchronize()
        step = self.step
        assert step is not None
        for start, end, stage, action, mb in self._pending:
            begin = self._anchor_ns + int(self._anchor.elapsed_time(start) * 1e6)
            finish = self._anchor_ns + int(self._anchor.elapsed_time(end) * 1e6)
            self.records.append(TraceRecord(self.rank, stage, action, mb, step, begin, finish))
        self._pending.clear()


class _Span:
    __slots__ = ("action", "mb", "stage", "started", "tracer")

    def __init__(self, tracer: StepTracer, action: TracedAction, stage: int, mb: int | None):
        self.tracer, self.action, self.stage, self.mb = tracer, action, stage, mb

    def __enter__(self) -> None:
        self.started = self.tracer._start() if self.tracer.recording else None

    def __exit__(self, *exc: object) -> None:
        if self.started is not None:
            self.tracer._finish(self.started, self.action, self.stage, self.mb)


def _traced(
    method: Callable[..., Any], tracer: StepTracer, action: TracedAction, stage: int
) -> Callable[..., Any]:
    """``method`` timed as ``action``; a forward's or backward's first argument is its
    micro-batch index."""
    indexed = action in (TracedAction.FORWARD, TracedAction.BACKWARD)

    @functools.wraps(method)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        microbatch = args[0] if indexed else None
        with tracer.span(action, stage, microbatch):
            return method(*args, **kwargs)

    return wrapper


_STAGE_METHODS = {
    "forward_one_chunk": TracedAction.FORWARD,
    "backward_one_chunk": TracedAction.BACKWARD,
    "perform_reduce_grad": TracedAction.GRAD_SYNC,
}


class Attachment:
    """What a tracer wrapped and hooked; :meth:`remove` puts everything back."""

    def __init__(self) -> None:
        self.stages: list[Any] = []
        self.handles: list[Any] = []
        self.models: list[Any] = []

    def remove(self) -> None:
        for stage in self.stages:
            for name in _STAGE_METHODS:
                vars(stage).pop(name, None)  # the class's own method again
        for handle in self.handles:
            handle.remove()
        for model in self.models:
            model.tracer = None
        self.stages.clear()
        self.handles.clear()
        self.models.clear()


def trace_pipeline(schedule: Any, tracer: StepTracer, attachment: Attachment) -> None:
    """Time every forward, backward and gradient reduction ``schedule`` (a
    ``torch.distributed.pipelining`` schedule of this rank) runs."""
    stages = getattr(schedule, "_stages", None) or [schedule._stage]
    for stage in stages:
        for name, action in _STAGE_METHODS.items():
            setattr(stage, name, _traced(getattr(stage, name), tracer, action, stage.stage_index))
        attachment.stages.append(stage)


def trace_optimizers(
    optimizers: Iterable[Any], tracer: StepTracer, stage: int, attachment: Attachment
) -> None:
    """Time each ``optimizer.step()`` through the optimizers' own step hooks."""
    for optimizer in optimizers:
        span: list[_Span] = []

        def before(opt: Any, args: Any, kwargs: Any, span: list[_Span] = span) -> None:
            span.append(tracer.span(TracedAction.OPTIMIZER, stage))
            span[-1].__enter__()

        def after(opt: Any, args: Any, kwargs: Any, span: list[_Span] = span) -> None:
            span.pop().__exit__(None, None, None)

        attachment.handles.append(optimizer.register_step_pre_hook(before))
        attachment.handles.append(optimizer.register_step_post_hook(after))


def attach_tracer(trainer: Any, tracer: StepTracer) -> Attachment:
    """Trace ``trainer`` (a :class:`~unipar.runtime.trainer.Trainer` after ``setup``):
    its pipeline schedule's actions, or without a pipeline each micro-batch's forward
    and backward, and its optimizers' steps. Steps are traced when run through
    :func:`traced_step`; ``.remove()`` on the result detaches it."""
    attachment = Attachment()
    model = trainer.model
    if model.schedule is not None:
        trace_pipeline(model.schedule, tracer, attachment)
    else:
        model.tracer = tracer
        attachment.models.append(model)
    trace_optimizers(trainer.optimizers, tracer, model.coordinates.pp, attachment)
    return attachment


def traced_step(trainer: Any, step: int, tracer: StepTracer) -> Any:
    """``trainer.train_step(step)`` with ``tracer`` recording if ``step`` is traced."""
    tracer.begin_step(step)
    try:
        return trainer.train_step(step)
    finally:
        tracer.end_step()
