"""Tiresias (Gu et al., NSDI'19): discretised two-dimensional least attained service.

A job's attained service is GPUs × seconds run. Queues are bounded by ``thresholds``
(GPU-seconds): a job sits in the first queue whose bound exceeds its service. Higher queues
go first; within a queue, jobs go in submission order (FIFO, §3.2). Each round the jobs are
taken in that order and get the GPUs they asked for if that many are free (lower-priority
running jobs are preempted by not being chosen). A job that waited more than
``starvation`` times its run time is promoted to the first queue (§3.2 starvation).
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass

from unipar.sched.policies.fixed import fixed_allocations
from unipar.sched.policy import Allocation, Policy, RoundState


@dataclass
class TiresiasPolicy(Policy):
    thresholds: tuple[float, ...] = (57600.0,)  # GPU-seconds between queues
    starvation: float = 0.0  # 0: no promotion
    name: str = "tiresias"

    def allocate(self, state: RoundState) -> dict[str, Allocation]:
        def priority(job):
            queue = bisect.bisect_right(self.thresholds, job.attained_service)
            waited = state.now - job.submit_time - job.run_time
            if self.starvation and waited > self.starvation * max(job.run_time, 1.0):
                queue = 0
            return (queue, job.submit_time)

        free = len(state.available_nodes) * state.cluster.gpus_per_node
        demands = []
        for job in sorted(state.jobs, key=priority):
            if job.requested_replicas <= free:
                demands.append((job, job.requested_replicas))
                free -= job.requested_replicas
        return fixed_allocations(state, demands)
