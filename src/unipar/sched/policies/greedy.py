"""Greedy allocation of GPUs by marginal value, allowing jumps over flat stretches.

Minimises Σ_j cost_j(k_j) subject to Σ k_j ≤ G, one GPU bundle at a time: the job whose
next step (from k to any k' > k) lowers its cost most per GPU added goes first. For costs
convex in k this is the exact optimum of a separable convex resource allocation (Ibaraki &
Katoh, "Resource Allocation Problems", 1988, ch. 4); allowing jumps handles the steps that
node boundaries put into throughput curves.
"""

from __future__ import annotations

import heapq

import numpy as np


def greedy(cost: np.ndarray, start: np.ndarray, budget: int) -> np.ndarray:
    """GPUs per job. ``cost``: (J, K+1), column k = cost with k GPUs (inf where not
    allowed); ``start``: GPUs each job begins with (already paid out of ``budget``)."""
    alloc = start.astype(int).copy()
    budget = int(budget)
    span = cost.shape[1] - 1

    def best(j: int):
        k = alloc[j]
        hi = min(span, k + budget)
        if hi <= k:
            return None
        ahead = cost[j, k + 1 : hi + 1]
        with np.errstate(invalid="ignore"):  # inf - inf: no better, skipped below
            rate = (cost[j, k] - ahead) / np.arange(1, hi - k + 1)
        i = int(np.argmax(rate))
        if np.isnan(rate[i]) or rate[i] <= 0:
            return None
        return (-float(rate[i]), j, k + i + 1)

    heap = [b for j in range(len(alloc)) if (b := best(j)) is not None]
    heapq.heapify(heap)
    while heap and budget > 0:
        _, j, target = heapq.heappop(heap)
        need = target - alloc[j]
        if need > budget:  # stale: recompute within what is left
            b = best(j)
            if b is not None:
                heapq.heappush(heap, b)
            continue
        alloc[j] = target
        budget -= need
        b = best(j)
        if b is not None:
            heapq.heappush(heap, b)
    return alloc
