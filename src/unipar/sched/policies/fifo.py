"""First in, first out: each job gets the GPUs it asked for, in submission order, and
keeps them until it ends (no preemption; the queue's head blocks those behind it)."""

from __future__ import annotations

from unipar.sched.policies.fixed import fixed_allocations
from unipar.sched.policy import Allocation, Policy, RoundState


class FifoPolicy(Policy):
    name = "fifo"

    def allocate(self, state: RoundState) -> dict[str, Allocation]:
        free = len(state.available_nodes) * state.cluster.gpus_per_node
        demands = []
        running = [j for j in state.jobs if j.allocation is not None]
        waiting = sorted(
            (j for j in state.jobs if j.allocation is None), key=lambda j: j.submit_time
        )
        for job in running:
            demands.append((job, job.requested_replicas))
            free -= job.requested_replicas
        for job in waiting:
            if job.requested_replicas > free:
                break
            demands.append((job, job.requested_replicas))
            free -= job.requested_replicas
        return fixed_allocations(state, demands)
