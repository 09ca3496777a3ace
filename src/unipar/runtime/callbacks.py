"""What the controller tells code on the driver: :class:`Callback` hooks, the
:class:`WorkerInfo` of each worker, and :class:`WorkerLost` when a worker's process is gone.

No torch, no Ray: ``fit``'s checks and the front ends (tuning, the shared cluster's runner)
subclass :class:`Callback` without loading the runtime.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from unipar.runtime.metrics import StepMetrics


@dataclass(frozen=True)
class WorkerInfo:
    """One worker of the gang that ran a step: its rank there and where its process runs."""

    rank: int
    pid: int
    node_ip: str
    node_id: str
    # what Ray assigned its process ({"CPU": 1.0, "unipar_type_b": 1.0}): where it runs
    resources: dict[str, float] = field(default_factory=dict)


class WorkerLost(Exception):
    """A worker's process is gone (killed, out of memory, node lost); the controller
    recovers by its :class:`~unipar.runtime.elastic.recovery.Recovery` policy."""

    def __init__(self, rank: int, cause: BaseException) -> None:
        super().__init__(f"worker rank {rank} was lost: {type(cause).__name__}: {cause}")
        self.rank = rank
        self.cause = cause


class Callback:
    """Hooks the controller calls on the driver. Override the ones you need."""

    def on_step(self, metrics: StepMetrics, workers: Sequence[WorkerInfo]) -> None:
        """Called once the reports of every worker for a step have arrived."""

    def on_failure(self, failure: WorkerLost, attempt: int) -> None:
        """Called after a worker was lost, before the gang recovers (or gives up)."""

    def on_resize(self, event: Any) -> None:
        """Called when an elastic gang re-formed with another number of workers
        (a :class:`~unipar.runtime.elastic.formation.ResizeEvent`)."""
