"""Pollux's throughput model fitted as Pollux's runtime fits it: least log error, bounded.

The model of :mod:`unipar.goodput.throughput` (Pollux, OSDI'21, eqs. 8-10), fitted the way
AdaptDL does (``fit_perf_params`` in its ``goodput.py``, which Sia's simulator also runs):
minimise, over θ = (α_c, β_c, α_n, β_n, α_l, β_l, γ) within [1e-8, ∞)^6 × [1, 10],

    RMSE(log T̂_grad, log(step − sync)) + RMSE(log T̂_step, log step)
      + 10^-3 (γ − 1)^2 + 10^-2 ((β_n/α_n)^2 + (β_l/α_l)^2)

(T̂_step = (T̂_grad^γ + T̂_sync^γ)^(1/γ); T̂_sync of one GPU is 10^-8), by L-BFGS-B with
the gradient written out below, from θ0 = (0.1, 0.01, 0.1, 0.01, 0.1, 0.01, 1.001).
What the observations cannot tell is fixed: α_c at half the mean compute time when one
per-GPU batch was seen (optimistic about larger batches), the cross-node line at its
floor without multi-node steps, the within-node line without multi-GPU single-node steps,
both slopes without steps on more than two GPUs; afterwards, without multi-node steps,
the cross-node line is at least 1.1 times the within-node one. Compared with
:func:`unipar.goodput.throughput.fit` (lines by least squares, γ on a grid) it weighs
errors relatively, which extrapolates better to per-GPU batches not yet run.
"""

from __future__ import annotations

import numpy as np

from unipar.goodput.throughput import Observation, ThroughputModel

_FLOOR = 1e-8
_START = np.array([0.1, 0.01, 0.1, 0.01, 0.1, 0.01, 1.001])  # α_c β_c α_n β_n α_l β_l γ


def _objective(theta: np.ndarray, data: tuple) -> tuple[float, np.ndarray]:
    """The loss and its gradient in θ."""
    m, k2, cross, local, log_compute, log_step = data
    a_c, b_c, a_n, b_n, a_l, b_l, g = theta
    n = len(m)
    grad = np.zeros(7)
    compute = a_c + b_c * m
    r1 = np.log(compute) - log_compute
    e1 = np.sqrt(np.mean(r1**2))
    w1 = r1 / compute / (n * max(e1, 1e-12))
    grad[0] += w1.sum()
    grad[1] += (w1 * m).sum()
    sync = np.where(cross, a_n + b_n * k2, np.where(local, a_l + b_l * k2, _FLOOR * (1 + k2)))
    cg, sg = compute**g, sync**g
    total = cg + sg
    pred = np.log(total) / g
    r2 = pred - log_step
    e2 = np.sqrt(np.mean(r2**2))
    w2 = r2 / (n * max(e2, 1e-12))
    d_compute = w2 * cg / compute / total
    d_sync = w2 * sg / sync / total
    grad[0] += d_compute.sum()
    grad[1] += (d_compute * m).sum()
    grad[2] += d_sync[cross].sum()
    grad[3] += (d_sync * k2)[cross].sum()
    grad[4] += d_sync[local].sum()
    grad[5] += (d_sync * k2)[local].sum()
    grad[6] += (w2 * ((cg * np.log(compute) + sg * np.log(sync)) / total / g
                      - np.log(total) / g**2)).sum()
    reg = 1e-3 * (g - 1) ** 2 + 1e-2 * ((b_n / a_n) ** 2 + (b_l / a_l) ** 2)
    grad[6] += 2e-3 * (g - 1)
    grad[2] -= 2e-2 * b_n**2 / a_n**3
    grad[3] += 2e-2 * b_n / a_n**2
    grad[4] -= 2e-2 * b_l**2 / a_l**3
    grad[5] += 2e-2 * b_l / a_l**2
    return float(e1 + e2 + reg), grad


def fit_log(observations: list[Observation],
            start: ThroughputModel | None = None) -> ThroughputModel:
    """Fit the model to reported step times by least log error (at least one).

    ``start``: the last fit on a subset of these observations; the search starts there (a
    few iterations instead of ~40 from θ0) and, L-BFGS-B being a local method, can end at a
    slightly different optimum than from θ0."""
    from scipy.optimize import minimize  # noqa: PLC0415 (heavy: scipy)

    o = np.array([[x.nodes, x.replicas, x.local_bsz, x.step_time, x.sync_time]
                  for x in observations], dtype=float)
    nodes, reps, m, step, sync = o.T
    compute = np.maximum(step - sync, _FLOOR)
    k2 = np.maximum(reps - 2, _FLOOR)
    cross, local = nodes > 1, (nodes == 1) & (reps > 1)
    theta = _START.copy()
    if start is not None:
        a_c, b_c, a_l, b_l, a_n, b_n, g = start.as_array()
        theta = np.clip([a_c, b_c, a_n, b_n, a_l, b_l, g], _FLOOR, None)
        theta[6] = min(max(theta[6], 1.0), 10.0)
    lower = np.array([_FLOOR] * 6 + [1.0])
    upper = np.array([np.inf] * 6 + [10.0])
    free = np.ones(7, dtype=bool)
    if len(np.unique(m)) == 1:
        theta[0] = lower[0] = upper[0] = compute.mean() / 2
        free[0] = False
    fixed = []
    if not cross.any():
        fixed += [2, 3]
    if not local.any():
        fixed += [4, 5]
    if not (reps > 2).any():
        fixed += [3, 5]
    for i in fixed:
        theta[i] = _FLOOR
        free[i] = False
    data = (m, k2, cross, local, np.log(compute), np.log(step))

    def loss(x: np.ndarray) -> tuple[float, np.ndarray]:
        full = theta.copy()
        full[free] = x
        value, grad = _objective(full, data)
        return value, grad[free]

    result = minimize(loss, theta[free], jac=True, method="L-BFGS-B",
                      bounds=list(zip(lower[free], upper[free], strict=True)), tol=1e-5)
    theta[free] = result.x
    a_c, b_c, a_n, b_n, a_l, b_l, g = theta
    if not cross.any():  # never cheaper across nodes than within one
        a_n, b_n = max(a_n, 1.1 * a_l), max(b_n, 1.1 * b_l)
    return ThroughputModel(a_c, b_c, a_l, b_l, a_n, b_n, g)
