"""What a traced run records: one span of one action (a micro-batch's forward or
backward, the gradient sync, the optimizer step) on one pipeline rank, in nanoseconds.
Plain data: :mod:`unipar.runtime.tracing` records it on the workers,
:mod:`unipar.viz.trace` writes and draws it."""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from typing import Any


class TracedAction(Enum):
    FORWARD = "forward"
    BACKWARD = "backward"
    GRAD_SYNC = "grad sync"
    OPTIMIZER = "optimizer"


@dataclass(frozen=True)
class TraceRecord:
    rank: int  # pipeline rank
    stage: int
    action: TracedAction
    microbatch: int | None
    step: int
    start_ns: int
    end_ns: int

    def to_dict(self) -> dict[str, Any]:
        return {**vars(self), "action": self.action.value}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> TraceRecord:
        return cls(**{**data, "action": TracedAction(data["action"])})
