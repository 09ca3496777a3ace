"""Pollux's throughput model, fitted from the step times a job reports.

Pollux (Qiao et al., OSDI'21) §3.2, eqs. (8)-(10):
  T_grad(m)    = α_c + β_c·m                          (per-GPU batch m)
  T_sync(K, N) = 0 if K = 1;  α_l + β_l·(K−2) if N = 1;  α_n + β_n·(K−2) otherwise
  T_iter       = s·T_grad + (T_grad^γ + T_sync^γ)^(1/γ)   (s accumulation steps, γ ≥ 1
                 interpolates between no overlap (γ=1) and perfect overlap (γ→∞))
Parameters are fitted by least squares on the observations, each part on the times that
measure it (compute on single-GPU steps, on the growth of a step's time with its
accumulation steps where one spread and per-GPU batch ran at two or more counts (each
further micro-batch repeats the compute, not the synchronisation; AdaptDL times its
accumulation steps apart for the same reason), or else on (step − sync)/(s+1); the two
sync lines on what the compute line leaves of the step time), then γ by a one-dimensional
search on the step times. Unobserved parts fall back to optimistic
priors (no sync cost; cross-node sync as within a node), as Pollux does before a job has run
on more GPUs; the policies bound exploration (at most twice the GPUs seen so far).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

GAMMAS = np.linspace(1.0, 10.0, 37)


@dataclass(frozen=True)
class Observation:
    """One step time a job reported: spread, per-GPU batch, seconds per step and sync,
    and its accumulation steps (``accum`` micro-batches besides the one that syncs)."""

    nodes: int
    replicas: int
    local_bsz: float
    step_time: float
    sync_time: float
    accum: int = 0


@dataclass(frozen=True)
class ThroughputModel:
    alpha_c: float
    beta_c: float
    alpha_l: float = 0.0
    beta_l: float = 0.0
    alpha_n: float = 0.0
    beta_n: float = 0.0
    gamma: float = 1.0

    def as_array(self) -> np.ndarray:
        return np.array(
            [self.alpha_c, self.beta_c, self.alpha_l, self.beta_l, self.alpha_n, self.beta_n,
             self.gamma]
        )

    def iter_time(self, nodes, replicas, local_bsz, accum=0):
        """Seconds per optimizer step (vectorised over numpy arguments)."""
        return iter_time(self.as_array(), nodes, replicas, local_bsz, accum)


def iter_time(params: np.ndarray, nodes, replicas, local_bsz, accum=0):
    """T_iter for parameter rows ``params[..., 7]`` (broadcast against the other arguments)."""
    p = np.moveaxis(np.asarray(params, dtype=float), -1, 0)
    a_c, b_c, a_l, b_l, a_n, b_n, gamma = p
    t_grad = a_c + b_c * local_bsz
    k2 = np.maximum(np.asarray(replicas) - 2, 0)
    t_sync = np.where(nodes > 1, a_n + b_n * k2, a_l + b_l * k2)
    t_sync = np.where(np.asarray(replicas) > 1, t_sync, 0.0)
    overlap = (t_grad**gamma + t_sync**gamma) ** (1.0 / gamma)
    return accum * t_grad + overlap


def _line(x: np.ndarray, y: np.ndarray) -> tuple[float, float]:
    """Least squares y = a + b·x with a, b ≥ 0 (one distinct x: half fixed, half per
    sample, a prior until a second batch is seen)."""
    if len(np.unique(x)) < 2:
        return float(np.mean(y) / 2), float(np.mean(y) / 2 / max(np.mean(x), 1e-12))
    b, a = np.polyfit(x, y, 1)
    if b < 0:
        return float(np.mean(y)), 0.0
    if a < 0:
        return 0.0, float(np.sum(x * y) / np.sum(x * x))
    return float(a), float(b)


def _sync_line(k2: np.ndarray, y: np.ndarray) -> tuple[float, float]:
    if len(np.unique(k2)) < 2:
        return float(np.mean(y)), 0.0
    return _line(k2, y)


def _compute(nodes, reps, m, step, sync, accum) -> tuple[np.ndarray, np.ndarray]:
    """(T_grad per observation, whether it is measured rather than bounded): one GPU's
    step is (s+1)·T_grad; where one spread and per-GPU batch ran at two or more
    accumulation counts, T_grad is the slope of their step times over s; else
    (step − sync)/(s+1), the synchronisation left in where it was not reported."""
    single = reps == 1
    compute = np.where(single, step, np.maximum(step - sync, 1e-6)) / (accum + 1)
    measured = single.copy()
    keys = np.stack([nodes, reps, m], axis=1)
    for key in np.unique(keys[~single], axis=0):
        rows = (keys == key).all(axis=1)
        if len(np.unique(accum[rows])) < 2:
            continue
        slope = np.polyfit(accum[rows], step[rows], 1)[0]
        if slope > 0:
            compute[rows], measured[rows] = slope, True
    return compute, measured


def fit(observations: list[Observation]) -> ThroughputModel:
    """Fit the model to a job's reported step times (at least one observation)."""
    o = np.array(
        [[x.nodes, x.replicas, x.local_bsz, x.step_time, x.sync_time, x.accum]
         for x in observations]
    )
    nodes, reps, m, step, sync, accum = o.T
    compute, measured = _compute(nodes, reps, m, step, sync, accum)
    rows = measured if measured.any() else np.ones_like(measured)
    a_c, b_c = _line(m[rows], compute[rows])
    # The reported sync times overlap with compute and are noisy: fit the sync lines on the
    # step time the compute line leaves unexplained (exact for γ = 1), then search γ.
    sync = np.maximum(step - (accum + 1) * (a_c + b_c * m), 0.0)
    local = (reps > 1) & (nodes == 1)
    cross = nodes > 1
    a_l = b_l = 0.0
    if local.any():
        a_l, b_l = _sync_line(reps[local] - 2, sync[local])
    a_n, b_n = a_l, b_l
    if cross.any():
        a_n, b_n = _sync_line(reps[cross] - 2, sync[cross])
        if not local.any():
            a_l, b_l = a_n, b_n  # optimistic: never worse within a node than across
    base = np.array([a_c, b_c, a_l, b_l, a_n, b_n, 1.0])
    params = np.repeat(base[None, :], len(GAMMAS), axis=0)
    params[:, 6] = GAMMAS
    pred = iter_time(params[:, None, :], nodes, reps, m, accum)
    err = np.sum(np.log(pred / step) ** 2, axis=1)
    gamma = float(GAMMAS[int(np.argmin(err))])
    return ThroughputModel(a_c, b_c, a_l, b_l, a_n, b_n, gamma)
