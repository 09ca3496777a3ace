"""The GPUs a job is worth at a price, shared by the autoscaler and the goodput policy.

With λ the JCT-seconds one GPU-second is worth, a job on k GPUs spends, per unit of
progress, 1/goodput(k) seconds of its completion time and k/goodput(k) GPU-seconds: it
is worth the k minimising (1 + λ·k) / goodput(k), the Lagrangian of "least total JCT for
a GPU-hour budget" split per job (the relaxation :mod:`unipar.sched.bound` bounds cost
with). A GPU more is worth adding while the completion time it saves exceeds λ times the
GPU-time it costs.
"""

from __future__ import annotations

import numpy as np

# A running job keeps its GPU count while that count's price per unit of progress is
# within this share of the best's: a restart (30 s) loses that share of a stretch of ten
# 60-s rounds, about as long as a choice holds before the gradient statistics, the fitted
# model or the cluster move it again. Without it a job at the border of two counts is
# moved back and forth, each move a restart.
KEEP_MARGIN = 0.05


def priced_cost(goodput: np.ndarray, allowed: np.ndarray, price: float) -> np.ndarray:
    """(1 + price·k) / goodput per job (row) and count k = 1.. (column k−1), infinite
    where not ``allowed``."""
    k = np.arange(1, goodput.shape[1] + 1)
    with np.errstate(divide="ignore"):
        return np.where(allowed & (goodput > 0), (1.0 + price * k[None, :]) / goodput, np.inf)


def priced_gpus(goodput: np.ndarray, allowed: np.ndarray, price: float) -> np.ndarray:
    """Per job, the GPU count minimising (1 + price·k)/goodput among the ``allowed`` ones
    (one GPU where none is)."""
    cost = priced_cost(goodput, allowed, price)
    best = np.argmin(cost, axis=1) + 1
    return np.where(np.isfinite(cost.min(axis=1)), best, 1)


def hopeful_worth(
    goodput: np.ndarray,
    allowed: np.ndarray,
    seen: np.ndarray,
    price: float,
    held: np.ndarray | None = None,
) -> np.ndarray:
    """:func:`priced_gpus`, optimistic past the most GPUs each job (or its peers) ran on
    (``seen``): there its goodput is at least its goodput there scaled linearly. A model
    fitted on the spreads a job ran is pessimistic about those it never saw (Pollux
    explores up to twice the most seen, §4.1); without the hope a price would keep a job
    from ever trying them. A running job's count (``held``, 0: none) stands while its
    price is within ``KEEP_MARGIN`` of the best's."""
    seen = np.clip(seen, 1, goodput.shape[1]).astype(int)
    k = np.arange(1, goodput.shape[1] + 1)
    rows = np.arange(len(goodput))
    at_seen = goodput[rows, seen - 1]
    linear = at_seen[:, None] * k[None, :] / seen[:, None]
    hopeful = np.where(k[None, :] > seen[:, None], np.maximum(goodput, linear), goodput)
    cost = priced_cost(hopeful, allowed, price)
    best = priced_gpus(hopeful, allowed, price)
    if held is None:
        return best
    now = cost[rows, np.clip(held, 1, goodput.shape[1]) - 1]
    close = (held >= 1) & (held <= goodput.shape[1]) & (now <= cost.min(axis=1) * (1 + KEEP_MARGIN))
    return np.where(close, held, best)
