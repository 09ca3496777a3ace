"""The best total batch for given GPUs, as AdaptDL's runtime chooses it (vectorised).

Pollux's job-side agent (AdaptDL ``goodput.py``, ``GoodputFunction.optimize``), which Sia's
simulator also runs: try ``BATCH_POINTS`` total batches M spaced geometrically from
max(M0, K·m_min) to M_max; split each over K GPUs into per-GPU batch m and s accumulation
steps, s = ⌈M / (K·m_max)⌉ − 1 (at least one when K = 1 and M > M0: one micro-batch gives
no estimate of the gradient noise), m = ⌈M / (K·(s+1))⌉; keep the M of the highest goodput
gain(M) / T_iter (:mod:`unipar.goodput.table`, :mod:`unipar.goodput.throughput`) among
those with m_min ≤ m ≤ m_max. Goodput here is in steps at M0 per second.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from unipar.goodput.table import gain
from unipar.goodput.throughput import iter_time

BATCH_POINTS = 50
_EPS = 1e-8


@dataclass(frozen=True)
class BatchChoice:
    """Per configuration: the best goodput (0 where no batch fits), its per-GPU batch and
    accumulation steps."""

    goodput: np.ndarray
    local_bsz: np.ndarray
    accum: np.ndarray


def best_batch(
    params: np.ndarray,
    grad_sqr,
    grad_var,
    init_batch,
    max_batch,
    min_local,
    max_local,
    nodes,
    replicas,
) -> BatchChoice:
    """The best batch per configuration; every argument broadcasts to one shape S
    (``params`` to S + (7,))."""
    shape = np.broadcast_shapes(
        np.shape(params)[:-1], *(np.shape(x) for x in (
            grad_sqr, grad_var, init_batch, max_batch, min_local, max_local, nodes, replicas))
    )
    r = np.broadcast_to(np.asarray(replicas, float), shape)
    low = np.maximum(init_batch, np.asarray(min_local, float) * r)
    frac = np.linspace(0.0, 1.0, BATCH_POINTS).reshape((-1,) + (1,) * len(shape))
    total = np.exp(np.log(low) + (np.log(max_batch) - np.log(low)) * frac)  # (P, *S)
    local = total / r
    accum = np.ceil(local / max_local - _EPS) - 1
    accum = np.where((r == 1) & (local > np.asarray(init_batch) + _EPS), np.maximum(accum, 1),
                     accum)
    atomic = np.ceil(local / (accum + 1) - _EPS)
    t = iter_time(params, nodes, r, atomic, accum)
    with np.errstate(divide="ignore"):  # t = 0 for a configuration given no model: 0 below
        good = gain(r * atomic * (accum + 1), init_batch, grad_sqr, grad_var) / t
    good = np.where((atomic >= min_local) & (atomic <= max_local) & np.isfinite(good), good, 0.0)
    best = np.argmax(good, axis=0)[None]
    pick = lambda a: np.take_along_axis(np.broadcast_to(a, good.shape), best, axis=0)[0]  # noqa: E731
    return BatchChoice(pick(good), pick(atomic).astype(int), pick(accum).astype(int))
