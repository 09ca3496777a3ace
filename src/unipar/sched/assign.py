"""One configuration per job at least total cost, with at most each GPU type's GPUs.

The integer program of Sia (SOSP'23, §4.2) and of unipar's typed policy: a multiple-choice
knapsack with one capacity per GPU type. Configurations dominated within their type (no
cheaper than one with fewer GPUs of the same type) are dropped first: swapping one for
the smaller never loses. Then:

- up to ``DP_STATES`` states, exactly, by dynamic programming over jobs on the GPUs used
  per type (a state is one vector of used GPUs; each job adds one configuration);
- beyond, by its LP relaxation (HiGHS, scipy's ``milp``): a basic optimum has at most
  one fractional job per type (one constraint each, besides one per job), which then take
  the cheapest configuration that fits; free GPUs then go to the moves that save most per
  GPU. The result is within those few jobs' configurations of the optimum.
"""

from __future__ import annotations

import numpy as np

DP_STATES = 200_000


def undominated(cost: np.ndarray, kinds: np.ndarray, gpus: np.ndarray) -> np.ndarray:
    """(J, C) mask of finite configurations cheaper than every smaller one of their type."""
    keep = np.isfinite(cost)
    for t in np.unique(kinds):
        cols = np.nonzero(kinds == t)[0]
        order = cols[np.argsort(gpus[cols], kind="stable")]
        best = np.minimum.accumulate(cost[:, order], axis=1)
        ahead = np.concatenate([np.full((len(cost), 1), np.inf), best[:, :-1]], axis=1)
        keep[:, order] &= cost[:, order] < ahead
    return keep


def assign(
    cost: np.ndarray, kinds: np.ndarray, gpus: np.ndarray, capacity: np.ndarray,
    pinned: dict[int, int] | None = None,
) -> np.ndarray | None:
    """Configuration index per job (every job gets one), or None when none fits.

    ``cost``: (J, C), inf where not allowed; ``kinds``: type index of each configuration;
    ``gpus``: its GPUs; ``capacity``: GPUs per type; ``pinned``: job -> configuration."""
    cost = np.array(cost, dtype=float)
    keep = undominated(cost, kinds, gpus)
    for i, c in (pinned or {}).items():
        keep[i] = False
        keep[i, c] = True
        cost[i, c] = min(cost[i, c], 1e12)
    if len(cost) == 0:
        return np.zeros(0, dtype=int)
    if not keep.any(axis=1).all():
        return None
    cost = np.where(keep, cost, np.inf)
    if np.prod(np.asarray(capacity, dtype=float) + 1) <= DP_STATES:
        return _dynamic(cost, kinds, gpus, np.asarray(capacity, dtype=int))
    return _relaxed(cost, kinds, gpus, np.asarray(capacity, dtype=int))


def _dynamic(cost, kinds, gpus, capacity) -> np.ndarray | None:
    shape = tuple(capacity + 1)
    best = np.full(shape, np.inf)
    best[(0,) * len(shape)] = 0.0
    picks = []
    for row in cost:
        new = np.full(shape, np.inf)
        pick = np.full(shape, -1, dtype=np.int32)
        for c in np.nonzero(np.isfinite(row))[0]:
            t, k = int(kinds[c]), int(gpus[c])
            if k > capacity[t]:
                continue
            src = [slice(None)] * len(shape)
            dst = [slice(None)] * len(shape)
            src[t], dst[t] = slice(0, shape[t] - k), slice(k, None)
            cand = best[tuple(src)] + row[c]
            view = new[tuple(dst)]
            better = cand < view
            np.copyto(view, cand, where=better)
            np.copyto(pick[tuple(dst)], c, where=better)
        picks.append(pick)
        best = new
    if not np.isfinite(best).any():
        return None
    state = list(np.unravel_index(int(np.argmin(best)), shape))
    out = np.zeros(len(cost), dtype=int)
    for j in range(len(cost) - 1, -1, -1):
        c = int(picks[j][tuple(state)])
        out[j] = c
        state[int(kinds[c])] -= int(gpus[c])
    return out


def _relaxed(cost, kinds, gpus, capacity) -> np.ndarray | None:
    """The LP relaxation (HiGHS), whose optimum has at most one fractional job per type,
    then those jobs placed where they fit best."""
    from scipy.optimize import Bounds, LinearConstraint, milp  # noqa: PLC0415 (heavy: scipy)
    from scipy.sparse import csr_matrix  # noqa: PLC0415 (heavy: scipy)

    jobs, cols = np.nonzero(np.isfinite(cost))
    n, m, types = len(jobs), len(cost), len(capacity)
    rows = np.concatenate([jobs, m + kinds[cols]])
    a = csr_matrix((np.concatenate([np.ones(n), gpus[cols]]), (rows, np.tile(np.arange(n), 2))),
                   shape=(m + types, n))
    lower = np.concatenate([np.ones(m), np.zeros(types)])
    upper = np.concatenate([np.ones(m), capacity])
    res = milp(cost[jobs, cols], integrality=np.zeros(n), bounds=Bounds(0, 1),
               constraints=LinearConstraint(a, lower, upper))
    if res.x is None:
        return None
    choice = np.full(m, -1)
    whole = res.x > 1 - 1e-6
    choice[jobs[whole]] = cols[whole]
    return _fill(cost, kinds, gpus, capacity, choice)


def _fill(cost, kinds, gpus, capacity, choice) -> np.ndarray | None:
    """Jobs without a configuration (-1) take their cheapest that fits, the job that would
    lose most by waiting first; then improving moves into free GPUs, most saved per GPU
    added first."""
    types = len(capacity)
    jobs = np.arange(len(cost))
    placed = choice >= 0
    used = np.bincount(kinds[choice[placed]], weights=gpus[choice[placed]], minlength=types)
    while (choice < 0).any():
        fits = np.isfinite(cost) & (gpus[None, :] <= (capacity - used)[kinds][None, :])
        fits[choice >= 0] = False
        if not fits.any():
            return None
        best = np.where(fits, cost, np.inf)
        j = int(np.argmax(np.where((choice < 0) & fits.any(axis=1), best.min(axis=1), -np.inf)))
        c = int(np.argmin(best[j]))
        choice[j] = c
        used[kinds[c]] += gpus[c]
    while True:
        same = kinds[None, :] == kinds[choice][:, None]
        extra = gpus[None, :] - np.where(same, gpus[choice][:, None], 0)
        room = (capacity - used)[kinds][None, :]
        fits = (extra <= room) & np.isfinite(cost) & (extra > 0)
        gain = np.where(fits, (cost[jobs, choice][:, None] - cost) / np.maximum(extra, 1),
                        -np.inf)
        j, c = np.unravel_index(int(np.argmax(gain)), gain.shape)
        if gain[j, c] <= 0:
            return choice
        used[kinds[choice[j]]] -= gpus[choice[j]]
        used[kinds[c]] += gpus[c]
        choice[j] = c
