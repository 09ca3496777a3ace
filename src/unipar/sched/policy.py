"""What a scheduling policy sees of each job, what it returns, and the interface.

The simulator and a live scheduler drive the same ``Policy`` objects: once per round (every
60 s in the paper's setting) ``allocate`` gets every job waiting or running and returns the
GPUs and batch of each job that should run.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from unipar.goodput.throughput import ThroughputModel
from unipar.sched.cluster import Cluster


@dataclass(frozen=True)
class Allocation:
    """GPUs per node (``(node, gpus)`` pairs) and the batch run on them."""

    nodes: tuple[tuple[int, int], ...]
    local_bsz: int
    accum: int = 0

    @property
    def replicas(self) -> int:
        return sum(g for _, g in self.nodes)

    @property
    def num_nodes(self) -> int:
        return len(self.nodes)

    @property
    def batch(self) -> int:
        return self.replicas * self.local_bsz * (self.accum + 1)


@dataclass(frozen=True)
class JobView:
    """A job as a policy sees it: its request and limits, and what it has reported."""

    name: str
    submit_time: float
    requested_replicas: int
    requested_batch: int
    init_batch: int
    max_batch: int
    min_local: int
    max_local: int
    progress: float  # steps at the initial batch done so far
    attained_service: float  # GPU-seconds received
    run_time: float  # seconds holding GPUs
    restarts: int
    max_replicas_seen: int
    allocation: Allocation | None
    model: ThroughputModel | None  # fitted on the step times the job reported
    grad_sqr: float
    grad_var: float
    user: str = ""
    # what other jobs of the same application reported (pooled), when the cluster keeps it
    peer_model: ThroughputModel | None = None
    peer_max_replicas: int = 0
    deadline: float | None = None  # absolute second by which the job should finish
    # work left: the job's declared length (its epochs) less its progress, in steps at M0
    remaining_progress: float = 0.0
    # Oracle for baselines defined with one (Optimus+Oracle); other policies ignore it:
    # exact progress/s of the requested batch on 1.. GPUs (fewest nodes)
    oracle_rate: np.ndarray | None = None
    max_replicas: int = 0  # the most GPUs the job may be given (0: no limit)


@dataclass(frozen=True)
class RoundState:
    now: float
    cluster: Cluster
    jobs: Sequence[JobView]
    available_nodes: tuple[int, ...]  # nodes that may be used this round
    restart_seconds: float = 30.0
    interval: float = 60.0
    gpu_quota: dict[str, int] | None = None  # per user, GPUs at once
    # JCT-seconds one GPU-second is worth where GPUs are paid for by use (an autoscaled
    # cluster): a job gets no GPU that saves less (:mod:`unipar.sched.price`); None: all
    gpu_price: float | None = None


class Policy(ABC):
    """A scheduling policy. ``allocate`` is called once per round with every unfinished,
    submitted job; jobs missing from its answer hold no GPUs until the next round."""

    name: str = "policy"
    adaptive_batch: bool = False  # chooses batch sizes (else runs the requested batch)

    @abstractmethod
    def allocate(self, state: RoundState) -> dict[str, Allocation]:
        """GPUs and batch for each job that runs in the coming round."""
