"""Goodput-optimal sharing: GPUs and batch size per job, after Pollux (Qiao et al., OSDI'21).

Each round every job's best goodput on k = 1.. GPUs is computed from its fitted throughput
model and reported gradient statistics, choosing batch size and accumulation per k
(``goodput.py``). Speedup_j(k) = goodput_j(k) / goodput_j(base), the base being one GPU or
a fair share (Pollux §3.2). GPUs are split to maximise the generalised mean with exponent p
of the speedups (Pollux eq. 12: p = −1), i.e. to minimise Σ_j w_j·speedup_j(k_j)^p for
p < 0, with weights w_j = 1 unless ``remaining_power`` weights jobs by their predicted
remaining time (declared length over fitted goodput) to favour the shorter. A job may use at
most ``explore`` times the most GPUs it (or, with ``share_models``, any job of its
application) has run on (Pollux §4.1: its model is untested beyond that), and always as
many as it holds, and never more than the job's own limit (``JobView.max_replicas``).

The search is the greedy of ``greedy.py`` (exact for concave speedups, milliseconds for
hundreds of jobs) rather than Pollux's genetic algorithm. Restarts: Pollux's reallocation
factor, and with ``restart_by_remaining`` the restart's seconds weighed against the job's
predicted remaining time at the new count. When jobs outnumber GPUs the first submitted
run. Per-user GPU quotas cap the sum of a user's GPUs (what they free goes to others); a
job with a deadline starts each round with the GPUs its deadline needs at its current
goodput, when the cluster has them.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from unipar.goodput.table import JobArrays, goodput_table
from unipar.sched.arrays import job_arrays
from unipar.sched.placement import Nodes, place
from unipar.sched.policies.greedy import greedy
from unipar.sched.policy import Allocation, JobView, Policy, RoundState
from unipar.sched.price import hopeful_worth


@dataclass
class GoodputPolicy(Policy):
    name: str = "unipar"
    p: float = -1.0  # generalised mean exponent (Pollux: −1)
    explore: float = 2.0  # most GPUs = explore × most seen so far
    whole_nodes: bool = True  # a job spans whole nodes or fits in one (no spreading)
    fair_share_base: bool = False  # speedup relative to an equal share, else to one GPU
    # weight (remaining seconds at a fair share / 1 h)^-remaining_power: shorter jobs first,
    # from the job's declared length (its epochs) and its fitted goodput; 0: unweighted
    remaining_power: float = 0.0
    restart_by_remaining: bool = False  # a restart costs δ against predicted time saved
    share_models: bool = False  # use the model pooled over jobs of the same application
    adaptive_batch = True

    def _arrays(self, jobs: list[JobView]) -> JobArrays:
        return job_arrays(jobs, [self._model(j) for j in jobs])

    def _model(self, job: JobView):
        return job.peer_model if self.share_models and job.peer_model else job.model

    def _seen(self, job: JobView) -> int:
        if self.share_models:
            return max(job.max_replicas_seen, job.peer_max_replicas)
        return job.max_replicas_seen

    def _admit(self, jobs: list[JobView], gpus: int) -> list[JobView]:
        return sorted(jobs, key=lambda j: j.submit_time)[:gpus]

    def allocate(self, state: RoundState) -> dict[str, Allocation]:
        gpn = state.cluster.gpus_per_node
        gpus = len(state.available_nodes) * gpn
        jobs = self._admit(list(state.jobs), gpus)
        if not jobs:
            return {}
        # never below what a job holds: one given workers before it reported (a live
        # service hands idle workers out) is not shrunk for want of reports
        cap = np.array(
            [min(gpus, max(1, min(int(self.explore * self._seen(j)), j.max_replicas or gpus),
                           j.allocation.replicas if j.allocation else 0)) for j in jobs]
        )
        fair = max(1, gpus // len(state.jobs)) if self.fair_share_base else 1
        deadlines = any(j.deadline is not None for j in jobs)
        kmax = gpus if deadlines else max(int(cap.max()), fair)
        table = goodput_table(self._arrays(jobs), kmax, gpn)
        k = np.arange(1, kmax + 1)
        # placement that avoids spreading: a job spans whole nodes or fits in one
        split = (k > gpn) & (k % gpn != 0) & self.whole_nodes
        start = self._floors(state, jobs, np.where(split[None, :], 0.0, table.goodput), gpus)
        cap = np.maximum(cap, start)
        # Pollux §3.2: speedup over the goodput at a fair share of the GPUs
        base = np.maximum(table.goodput[:, :fair].max(axis=1, keepdims=True), 1e-300)
        speedup = table.goodput / base
        speedup[(k[None, :] > cap[:, None]) | (table.goodput <= 0) | split[None, :]] = 0.0
        speedup[:, 0] = np.maximum(table.goodput[:, 0] / base[:, 0], 1e-9)  # 1 GPU: always
        self._restart_factor(state, jobs, speedup, table.goodput)
        with np.errstate(divide="ignore"):
            cost = np.where(speedup > 0, speedup**self.p, np.inf)
        if self.p > 0:
            cost = -np.where(speedup > 0, speedup**self.p, -np.inf)
        if self.remaining_power:
            remaining = np.array([j.remaining_progress for j in jobs]) / base[:, 0]
            # below one round, remaining times are not told apart (60 s in the simulator;
            # the live service's rounds are seconds apart, its jobs as short)
            floor = max(state.interval, 1e-3)
            cost = cost * (np.maximum(remaining, floor) / 3600.0)[:, None] ** -self.remaining_power
        cost = np.concatenate([np.full((len(jobs), 1), np.inf), cost], axis=1)
        if state.gpu_price is not None:  # GPUs paid by use: none past what a job is worth
            worth = np.maximum(self._worth(jobs, table.goodput, speedup > 0, state), start)
            cost[np.arange(kmax + 1)[None, :] > worth[:, None]] = np.inf
        counts = greedy(cost, start, gpus - int(start.sum()))
        trimmed = self._quota(state, jobs, counts)
        if (trimmed != counts).any():  # give what quotas took back to the others
            full = {u for u, q in state.gpu_quota.items()
                    if sum(trimmed[i] for i, j in enumerate(jobs) if j.user == u) >= q}
            for i, j in enumerate(jobs):
                if j.user in full:
                    cost[i, trimmed[i] + 1 :] = np.inf
            cost[trimmed == 0, 1:] = np.inf
            counts = greedy(cost, trimmed, gpus - int(trimmed.sum()))
        previous: dict[str, Nodes] = {
            j.name: j.allocation.nodes for j in jobs if j.allocation is not None
        }
        order = sorted(range(len(jobs)), key=lambda i: -counts[i])
        nodes = place(
            [(jobs[i].name, int(counts[i])) for i in order], previous,
            state.available_nodes, gpn, spread=not self.whole_nodes,
        )
        out = {}
        for i, j in enumerate(jobs):
            if j.name in nodes:
                c = sum(g for _, g in nodes[j.name]) - 1
                local = int(np.clip(table.local_bsz[i, c], 1, j.max_local))
                out[j.name] = Allocation(nodes[j.name], local, int(table.accum[i, c]))
        return out

    def _worth(self, jobs: list[JobView], goodput, allowed, state: RoundState) -> np.ndarray:
        """The GPUs each job is worth at the round's price, hopeful past what it or its
        peers ran on (:func:`unipar.sched.price.hopeful_worth`)."""
        seen = np.array([self._seen(j) for j in jobs])
        held = np.array([j.allocation.replicas if j.allocation else 0 for j in jobs])
        return hopeful_worth(goodput, allowed, seen, state.gpu_price, held)

    def _restart_factor(self, state: RoundState, jobs: list[JobView], speedup, goodput) -> None:
        """Scale the speedup of a running job at any other GPU count than its own.

        Pollux §4.1, eq. 13: REALLOC_FACTOR = (T − R·δ) / (T + δ), T the job's age, R its
        restarts so far, δ the restart seconds. With ``restart_by_remaining``, also by
        T_k / (T_k + δ), T_k the job's predicted remaining seconds on k GPUs (declared
        length over fitted goodput): moving pays only when the time saved exceeds δ.
        """
        delta = state.restart_seconds
        for i, j in enumerate(jobs):
            if j.allocation is None:
                continue
            age = state.now - j.submit_time
            factor = max(0.0, (age - j.restarts * delta) / (age + delta))
            mine = j.allocation.replicas
            held = speedup[i, mine - 1] if mine <= speedup.shape[1] else None
            if self.restart_by_remaining:
                with np.errstate(divide="ignore"):
                    left = j.remaining_progress / goodput[i]
                factor = factor * np.where(np.isfinite(left), left / (left + delta), 0.0)
            speedup[i] *= factor
            if held is not None:
                speedup[i, mine - 1] = held

    def _floors(self, state, jobs, goodput, gpus) -> np.ndarray:
        """GPUs each job starts with: one, or for a job with a deadline the fewest that meet
        it at its current goodput (all it can use when none do), latest-submitted floors
        dropped first when they do not all fit."""
        start = np.ones(len(jobs), dtype=int)
        for i, j in enumerate(jobs):
            if j.deadline is None:
                continue
            left = j.deadline - state.now - state.restart_seconds
            with np.errstate(divide="ignore"):
                need = j.remaining_progress / goodput[i]
            ok = np.nonzero(need <= max(left, 0.0))[0]
            best = int(ok[0]) + 1 if len(ok) else int(np.argmax(goodput[i])) + 1
            start[i] = min(best, gpus - len(jobs) + 1)  # the others keep one GPU each
        while start.sum() > gpus:
            i = int(np.argmax(np.where(start > 1, [j.submit_time for j in jobs], -np.inf)))
            start[i] = 1
        return start

    def _quota(self, state: RoundState, jobs: list[JobView], counts: np.ndarray) -> np.ndarray:
        """Per-user quotas: trim the largest allocations of a user over quota."""
        if not state.gpu_quota:
            return counts
        counts = counts.copy()
        for user, quota in state.gpu_quota.items():
            mine = [i for i, j in enumerate(jobs) if j.user == user]
            while mine and counts[mine].sum() > quota:
                i = max(mine, key=lambda i: counts[i])
                counts[i] -= 1
                if counts[i] == 0:
                    mine.remove(i)
        return counts


def pollux_policy() -> GoodputPolicy:
    """Our rendering of Pollux: p = −1 over speedups against a fair share, 2× exploration,
    its reallocation factor, FIFO admission; each job's model fitted on its own reports."""
    return GoodputPolicy(name="pollux", fair_share_base=True)


def unipar_policy() -> GoodputPolicy:
    """unipar's policy: Pollux's goodput model with a generalised mean (p = −0.5) weighted
    by 1 / predicted remaining time, throughput models pooled per application, and each
    move's restart weighed against the time it saves."""
    return GoodputPolicy(
        name="unipar", p=-0.5, fair_share_base=True, share_models=True, remaining_power=1.0,
        restart_by_remaining=True,
    )
