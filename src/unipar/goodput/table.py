"""Goodput of many jobs at many GPU counts, with the best batch size per count (vectorised).

Pollux (Qiao et al., OSDI'21) §3: GOODPUT(a, m, s) = THROUGHPUT(a, m, s) × EFFICIENCY(M),
here in progress per second (progress counts steps at the initial batch M0), so
  goodput = gain(M) / T_iter,  gain(M) = (var + sqr) / (var/S + sqr),  S = M / M0,
with M = K·m·(s+1) for K GPUs, per-GPU batch m and s accumulation steps, M0 ≤ M ≤ M_max and
m ≤ the job's largest per-GPU batch. Batch size is chosen per allocation by searching a
geometric grid of m and s = 0..S-1 (Pollux §3.1: adapt batch and accumulation to the share).
A fixed-batch job (``adaptive`` false) runs its requested batch, split as ``split_batch``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from unipar.goodput.throughput import iter_time

LOCAL_GRID = 16  # per-GPU batch candidates per job (geometric)
MAX_ACCUM = 6  # accumulation steps searched: s = 0 .. MAX_ACCUM-1


def split_batch(batch: int, replicas: int, max_local: int) -> tuple[int, int]:
    """(per-GPU batch, accumulation steps) running total ``batch`` on ``replicas`` GPUs."""
    local = math.ceil(batch / replicas)
    accum = math.ceil(local / max_local) - 1
    return math.ceil(batch / (replicas * (accum + 1))), accum


@dataclass(frozen=True)
class JobArrays:
    """What the goodput search needs of J jobs, as arrays of length J."""

    params: np.ndarray  # (J, 7) throughput model
    grad_sqr: np.ndarray
    grad_var: np.ndarray
    init_batch: np.ndarray
    max_batch: np.ndarray
    min_local: np.ndarray
    max_local: np.ndarray
    fixed_batch: np.ndarray  # the user's batch; used where adaptive is false
    adaptive: np.ndarray  # bool
    min_batch: np.ndarray | None = None  # the smallest total batch (None: init_batch)


@dataclass(frozen=True)
class GoodputTable:
    """Best goodput per job and GPU count (column k is k+1 GPUs), and the batch achieving it."""

    goodput: np.ndarray  # (J, K), 0 where no batch fits
    local_bsz: np.ndarray  # (J, K) int
    accum: np.ndarray  # (J, K) int


def gain(batch, init_batch, sqr, var):
    """AdaScale's gain (Johnson et al. 2020, eq. 5): (var + sqr) / (var/S + sqr), S = M / M0."""
    scale = batch / init_batch
    return (var + sqr) / (var / scale + sqr)


def goodput_table(
    jobs: JobArrays, max_gpus: int, gpus_per_node: int, local_grid: int = LOCAL_GRID
) -> GoodputTable:
    """Goodput for 1..max_gpus GPUs per job, on the fewest nodes (⌈K/gpus_per_node⌉),
    searching ``local_grid`` geometric per-GPU batches."""
    n = len(jobs.grad_sqr)
    k = np.arange(1, max_gpus + 1, dtype=float)
    nodes = np.ceil(k / gpus_per_node)
    frac = np.linspace(0.0, 1.0, local_grid)
    lo, hi = np.log(jobs.min_local), np.log(jobs.max_local)
    m = np.round(np.exp(lo[:, None] + (hi - lo)[:, None] * frac[None, :]))  # (J, L)
    s = np.arange(MAX_ACCUM, dtype=float)
    col = (slice(None), None, None, None)
    # axes: job, K, local, accum
    kk, nn = k[None, :, None, None], nodes[None, :, None, None]
    mm, ss = m[:, None, :, None], s[None, None, None, :]
    total = kk * mm * (ss + 1)
    t = iter_time(jobs.params[:, None, None, None, :], nn, kk, mm, ss)
    eff = gain(total, jobs.init_batch[col], jobs.grad_sqr[col], jobs.grad_var[col])
    least = jobs.init_batch if jobs.min_batch is None else jobs.min_batch
    ok = (total >= least[col]) & (total <= jobs.max_batch[col])
    # a smaller per-GPU batch than the grid's is fine when more GPUs share M0
    good = np.where(ok, eff / t, 0.0).reshape(n, max_gpus, -1)
    best = np.argmax(good, axis=2)
    goodput = np.take_along_axis(good, best[..., None], axis=2)[..., 0]
    local = m[np.arange(n)[:, None], best // MAX_ACCUM].astype(int)
    accum = (best % MAX_ACCUM).astype(int)
    fixed = ~jobs.adaptive
    if fixed.any():
        g, lb, ac = _fixed(jobs, fixed, k, nodes)
        goodput[fixed], local[fixed], accum[fixed] = g, lb, ac
    return GoodputTable(goodput, local, accum)


def _fixed(jobs: JobArrays, rows: np.ndarray, k: np.ndarray, nodes: np.ndarray):
    batch = jobs.fixed_batch[rows][:, None]
    max_local = jobs.max_local[rows][:, None]
    local = np.ceil(batch / k[None, :])
    accum = np.ceil(local / max_local) - 1
    local = np.ceil(batch / (k[None, :] * (accum + 1)))
    t = iter_time(jobs.params[rows][:, None, :], nodes[None, :], k[None, :], local, accum)
    eff = gain(batch, jobs.init_batch[rows][:, None], jobs.grad_sqr[rows][:, None],
               jobs.grad_var[rows][:, None])
    return eff / t, local.astype(int), accum.astype(int)
