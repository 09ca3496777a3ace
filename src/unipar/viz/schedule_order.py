"""The order in which each pipeline rank runs its forwards and backwards, taken from the
``torch.distributed.pipelining`` schedule classes the runtime builds (not a second copy).

- ``ScheduleInterleaved1F1B`` computes every rank's action list (``pipeline_order``) in
  its constructor from the pipeline size, the stages per rank and the micro-batch count;
  its runtime executes exactly that list.
- ``ScheduleGPipe`` and ``Schedule1F1B`` run their order as code
  (``_step_microbatches``). That code is run here against a recording stand-in for the
  stage: no process group, no model, nothing computed, only the calls to
  ``forward_one_chunk`` / ``backward_one_chunk`` in the order made. (Their schedule IR,
  ``_get_pipeline_order``, is not used: in torch 2.13 Schedule1F1B's numbers the last
  rank's micro-batches from 1.)

The stand-ins carry only what the constructors read (``num_stages``, ``group_size``,
``group_rank``, ``stage_index``), as torch's own ``_schedule_visualizer`` does with mocks.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from typing import Any

from unipar.errors import ConfigError
from unipar.plan.representation import PipelineSchedule


class ActionKind(Enum):
    FORWARD = "F"
    BACKWARD = "B"


@dataclass(frozen=True)
class Action:
    """One compute action of a pipeline rank: ``kind`` of ``microbatch`` on ``stage``
    (stage ``s`` lives on rank ``s % pp``)."""

    stage: int
    kind: ActionKind
    microbatch: int


class _RecordingStage:
    """Stands in for a ``PipelineStage``: no tensors, no communication; records the
    forwards and backwards the schedule asks of it."""

    def __init__(self, stage_index: int, num_stages: int, pp: int) -> None:
        self.stage_index, self.num_stages = stage_index, num_stages
        self.group_size, self.group_rank = pp, stage_index % pp
        self.is_first, self.is_last = stage_index == 0, stage_index == num_stages - 1
        self.submod = None
        self.actions: list[Action] = []

    def get_fwd_recv_ops(self, microbatch: int) -> list:
        return []

    get_fwd_send_ops = get_bwd_recv_ops = get_bwd_send_ops = get_fwd_recv_ops

    def forward_one_chunk(self, microbatch: int, *args: Any, **kwargs: Any) -> None:
        self.actions.append(Action(self.stage_index, ActionKind.FORWARD, microbatch))

    def backward_one_chunk(self, microbatch: int, *args: Any, **kwargs: Any) -> None:
        self.actions.append(Action(self.stage_index, ActionKind.BACKWARD, microbatch))

    def perform_reduce_grad(self, *args: Any, **kwargs: Any) -> None:
        pass


def _construct(cls: type, stages: Any, num_microbatches: int) -> Any:
    try:
        return cls(stages, num_microbatches)
    except ValueError as error:
        raise ConfigError(f"torch's {cls.__name__} refuses this plan: {error}") from error


def _recorded_order(
    schedule: PipelineSchedule, rank: int, pp: int, num_microbatches: int
) -> list[Action]:
    """Run the single-stage schedule's own loop for ``rank`` on a recording stage."""
    stage = _RecordingStage(rank, pp, pp)
    instance = _construct(torch_schedule_class(schedule), stage, num_microbatches)
    instance._initialize_stage = lambda *args, **kwargs: None  # no buffers to prepare
    instance._step_microbatches([()] * num_microbatches, [{}] * num_microbatches)
    return stage.actions


def torch_schedule_class(schedule: PipelineSchedule) -> type:
    """The ``torch.distributed.pipelining`` class the runtime builds for ``schedule``
    (see :func:`unipar.runtime.parallel.parallelize._pipeline_schedule`)."""
    # drawing a schedule's order needs neither torch nor its pipelining until this lookup
    from torch.distributed import pipelining  # noqa: PLC0415 (heavy: torch.distributed.pipelining)

    return {
        PipelineSchedule.GPIPE: pipelining.ScheduleGPipe,
        PipelineSchedule.ONE_F_ONE_B: pipelining.Schedule1F1B,
        PipelineSchedule.INTERLEAVED_1F1B: pipelining.ScheduleInterleaved1F1B,
    }[schedule]


def pipeline_order(
    schedule: PipelineSchedule, pp: int, num_microbatches: int, virtual_stages: int = 1
) -> dict[int, list[Action]]:
    """Each pipeline rank's forwards and backwards, in the order torch runs them.

    Idle slots and gradient-reduction markers of torch's schedule IR are dropped: the
    times come from the cost model, not from the IR's unit slots."""
    if pp < 1 or num_microbatches < 1 or virtual_stages < 1:
        raise ConfigError(
            f"a pipeline order needs pp, num_microbatches and virtual_stages >= 1, but got "
            f"pp={pp}, num_microbatches={num_microbatches}, virtual_stages={virtual_stages}"
        )
    if pp == 1:
        forwards = [Action(0, ActionKind.FORWARD, i) for i in range(num_microbatches)]
        backwards = [Action(0, ActionKind.BACKWARD, i) for i in range(num_microbatches)]
        # Without a pipeline the runtime runs each micro-batch's forward then backward.
        return {0: [a for pair in zip(forwards, backwards, strict=True) for a in pair]}
    if schedule is not PipelineSchedule.INTERLEAVED_1F1B:
        if virtual_stages != 1:
            raise ConfigError(
                f"virtual_stages={virtual_stages} needs the interleaved_1f1b schedule, but "
                f"got {schedule.value}; set virtual_stages=1 or schedule=interleaved_1f1b"
            )
        return {rank: _recorded_order(schedule, rank, pp, num_microbatches) for rank in range(pp)}
    cls = torch_schedule_class(schedule)
    stages = [_RecordingStage(k * pp, pp * virtual_stages, pp) for k in range(virtual_stages)]
    order = _construct(cls, stages, num_microbatches).pipeline_order
    kinds = {"F": ActionKind.FORWARD, "B": ActionKind.BACKWARD}
    return {
        rank: [
            Action(a.stage_index, kinds[a.computation_type.value], a.microbatch_index)
            for a in actions
            if a is not None and a.computation_type.value in kinds
        ]
        for rank, actions in sorted(order.items())
    }
