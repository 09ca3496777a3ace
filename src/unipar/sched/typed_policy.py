"""What a policy for a cluster of several GPU types sees of each job, and its interface.

The typed simulator (and, later, a live scheduler) calls ``allocate`` once per round with
every job waiting or running; the answer puts each job that should run on GPUs of one type
(:class:`~unipar.sched.typed_cluster.TypedAllocation`). The job's runtime then chooses its
batch for those GPUs (:mod:`unipar.goodput.batch`) at each start and each epoch, with the
throughput model the policy names (``batch_model``).
"""

from __future__ import annotations

import enum
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from unipar.goodput.throughput import ThroughputModel
from unipar.sched.typed_cluster import TypedAllocation, TypedCluster


class BatchModel(enum.Enum):
    """Which throughput model a job's runtime picks its batch with."""

    OWN = "own"  # fitted on the job's own step times on its current GPU type
    MERGED = "merged"  # on all its step times, whatever the type (heterogeneity-unaware)
    POOLED = "pooled"  # on every job of its application on its type (its own until any)


@dataclass(frozen=True)
class LocalLimits:
    """Per-GPU batch limits of an application on one GPU type (memory, measured range)."""

    min_local: int
    max_local: int


@dataclass(frozen=True)
class TypedJobView:
    """A job as a policy sees it: its request, its limits per type, what it reported."""

    name: str
    application: str
    submit_time: float
    requested_replicas: int
    requested_batch: int
    init_batch: int  # M0
    max_batch: int
    limits: Mapping[str, LocalLimits]  # per GPU type
    restart_seconds: float  # its application's measured checkpoint-restore time
    epoch: int
    progress: float  # steps at M0 done
    remaining_progress: float  # steps at M0 left to its declared epochs
    attained_service: float  # GPU-seconds held so far
    restarts: int
    restart_left: float  # seconds of a checkpoint-restore still to run (0: none)
    allocation: TypedAllocation | None
    grad: tuple[float, float] | None  # last reported (grad_sqr, grad_var); None: never ran
    models: Mapping[str, ThroughputModel] = field(default_factory=dict)  # own, per type
    seen: Mapping[str, int] = field(default_factory=dict)  # most GPUs run on, per type
    merged_model: ThroughputModel | None = None  # own, all types as one
    merged_seen: int = 0
    pooled_models: Mapping[str, ThroughputModel] = field(default_factory=dict)  # application
    pooled_seen: Mapping[str, int] = field(default_factory=dict)
    # samples/s on one GPU of each type, as profiling a new job there measures it (Sia §4)
    profile: Mapping[str, float] = field(default_factory=dict)


@dataclass(frozen=True)
class TypedRoundState:
    now: float
    cluster: TypedCluster
    jobs: Sequence[TypedJobView]
    interval: float = 60.0


class TypedPolicy(ABC):
    """A scheduling policy for a cluster of several GPU types."""

    name: str = "policy"
    batch_model: BatchModel = BatchModel.OWN

    @abstractmethod
    def allocate(self, state: TypedRoundState) -> dict[str, TypedAllocation]:
        """GPUs of one type for each job that runs in the coming round; jobs left out hold
        none until the next round."""
