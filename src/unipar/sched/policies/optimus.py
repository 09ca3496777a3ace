"""Optimus (Peng et al., EuroSys'18) with an oracle of job lengths, as in Pollux §5.

Each job's remaining time on k GPUs is its remaining work over its speed at its requested
batch (the oracle: exact, from the measured traces). Jobs are admitted shortest remaining
time first with one GPU each; the remaining GPUs then go, one bundle at a time, to the job
whose remaining time drops most per GPU added (Optimus §4.2, marginal gain). Placement packs
each job onto the fewest nodes.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from unipar.sched.policies.fixed import fixed_allocations
from unipar.sched.policies.greedy import greedy
from unipar.sched.policy import Allocation, Policy, RoundState


@dataclass
class OptimusPolicy(Policy):
    name: str = "optimus"
    needs_oracle = True

    def allocate(self, state: RoundState) -> dict[str, Allocation]:
        gpus = len(state.available_nodes) * state.cluster.gpus_per_node
        jobs = sorted(state.jobs, key=lambda j: j.remaining_progress / j.oracle_rate[0])
        jobs = jobs[:gpus]
        if not jobs:
            return {}
        cost = np.full((len(jobs), gpus + 1), np.inf)
        for i, job in enumerate(jobs):
            kmax = min(gpus, max(1, job.requested_batch // job.min_local))
            cost[i, 1 : kmax + 1] = job.remaining_progress / job.oracle_rate[:kmax]
        alloc = greedy(cost, np.ones(len(jobs)), gpus - len(jobs))
        return fixed_allocations(state, [(j, int(k)) for j, k in zip(jobs, alloc, strict=True)])
