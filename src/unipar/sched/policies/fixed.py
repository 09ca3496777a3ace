"""Helpers for policies that run each job at the batch its user asked for."""

from __future__ import annotations

from unipar.goodput.table import split_batch
from unipar.sched.placement import Nodes, place
from unipar.sched.policy import Allocation, JobView, RoundState


def fixed_allocations(
    state: RoundState, demands: list[tuple[JobView, int]]
) -> dict[str, Allocation]:
    """Place ``(job, gpus)`` demands (in priority order) at each job's requested batch."""
    previous: dict[str, Nodes] = {
        j.name: j.allocation.nodes for j, _ in demands if j.allocation is not None
    }
    nodes = place(
        [(j.name, k) for j, k in demands], previous, state.available_nodes,
        state.cluster.gpus_per_node,
    )
    out = {}
    for job, k in demands:
        if job.name in nodes:
            local, accum = split_batch(job.requested_batch, k, job.max_local)
            out[job.name] = Allocation(nodes[job.name], local, accum)
    return out
