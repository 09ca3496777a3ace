"""How many nodes an autoscaled cluster should hold, from what its jobs report.

Three rules, each judged on the goodput each job would get on k = 1.. GPUs (its throughput
model pooled over its application, its gradient statistics; Pollux §3), with k at most
twice what it or its peers ran on (Pollux §4.1) and a job over one node on whole nodes:

- ``PRICE``: each job wants the k minimising (1 + λ·k) / goodput(k), i.e. the time to
  its next unit of progress plus λ times the GPU-seconds spent on it; a GPU is added while
  the JCT-seconds it saves exceed λ times the GPU-seconds it costs (the Lagrangian of
  "least average JCT for a node-hour budget", as in ``bound.py``). Nodes = ⌈Σ k / gpn⌉.
- ``UTILITY``: Pollux's cloud mode (§4.3; AdaptDL's thresholds 0.35 and 0.65): the
  utility of N nodes is Σ_j speedup_j(k_j) / (gpn·N), the allocation k maximising the sum
  of speedups over one GPU; kept while the current size's utility is inside
  [low, high], otherwise the size whose utility is nearest the middle.
- ``DEMAND``: each job's useful GPUs are the most at which its goodput per GPU is still
  ``efficiency`` of its goodput on one GPU; nodes = ⌈Σ / gpn⌉.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from enum import Enum

import numpy as np

from unipar.errors import ConfigError
from unipar.goodput.table import goodput_table
from unipar.sched.arrays import job_arrays
from unipar.sched.policies.greedy import greedy
from unipar.sched.policy import JobView
from unipar.sched.price import hopeful_worth


class ScaleRule(Enum):
    PRICE = "price"
    UTILITY = "utility"
    DEMAND = "demand"


@dataclass(frozen=True)
class ScaleConfig:
    rule: ScaleRule = ScaleRule.PRICE
    price: float = 0.1  # PRICE: λ, JCT-seconds one GPU-second is worth
    low: float = 0.35  # UTILITY: keep the size while utility is in [low, high]
    high: float = 0.65
    efficiency: float = 0.5  # DEMAND: least goodput per GPU over goodput on one GPU
    every: float = 60.0  # seconds between decisions (one scheduling round)

    def __post_init__(self) -> None:
        if self.price < 0 or not 0 < self.low <= self.high or not 0 < self.efficiency <= 1:
            raise ConfigError(
                f"autoscaling needs price >= 0, 0 < low <= high and 0 < efficiency <= 1, "
                f"but got price={self.price}, low={self.low}, high={self.high}, "
                f"efficiency={self.efficiency}"
            )


def _goodput(jobs: Sequence[JobView], max_gpus: int, gpn: int):
    """(goodput (J, K), allowed (J, K)) over k = 1..K GPUs, K = the largest cap."""
    cap = np.array([max(1, 2 * max(j.max_replicas_seen, j.peer_max_replicas)) for j in jobs])
    kmax = int(min(cap.max(), max_gpus))
    table = goodput_table(job_arrays(jobs, [j.peer_model or j.model for j in jobs]), kmax, gpn)
    k = np.arange(1, kmax + 1)
    allowed = (k[None, :] <= cap[:, None]) & (table.goodput > 0)
    allowed &= ~((k > gpn) & (k % gpn != 0))[None, :]
    allowed[:, 0] = True
    return np.maximum(table.goodput, 1e-300), allowed


def useful_gpus(
    jobs: Sequence[JobView], max_gpus: int, gpus_per_node: int, efficiency: float = 0.5
) -> np.ndarray:
    """Each job's useful GPUs (Pollux §4.3): the most at which its goodput per GPU is still
    ``efficiency`` of its goodput on one GPU, at most twice what it or its peers ran on."""
    goodput, allowed = _goodput(jobs, max_gpus, gpus_per_node)
    return _demand_gpus(goodput, allowed, efficiency)


def _demand_gpus(goodput: np.ndarray, allowed: np.ndarray, efficiency: float) -> np.ndarray:
    k = np.arange(1, goodput.shape[1] + 1)
    per_gpu = goodput / (k[None, :] * goodput[:, :1])
    return np.where(allowed & (per_gpu >= efficiency), k[None, :], 1).max(axis=1)


def utilities(goodput: np.ndarray, allowed: np.ndarray, gpn: int, max_nodes: int) -> np.ndarray:
    """Pollux's utility of 1..max_nodes nodes: Σ speedup / GPUs, the GPUs split to maximise
    the sum of speedups over one GPU (a job may get none when GPUs are short)."""
    cost = np.where(allowed, -goodput / goodput[:, :1], np.inf)
    cost = np.concatenate([np.zeros((len(goodput), 1)), cost], axis=1)
    rows = np.arange(len(goodput))
    out = np.empty(max_nodes)
    for n in range(1, max_nodes + 1):
        counts = greedy(cost, np.zeros(len(goodput), dtype=int), n * gpn)
        out[n - 1] = -cost[rows, counts].sum() / (n * gpn)
    return out


def desired_nodes(
    jobs: Sequence[JobView], current: int, min_nodes: int, max_nodes: int, gpn: int,
    config: ScaleConfig,
) -> int:
    """The node count the cluster should move to, in [min_nodes, max_nodes]."""
    if not jobs:
        return min_nodes
    goodput, allowed = _goodput(jobs, max_nodes * gpn, gpn)
    if config.rule is ScaleRule.UTILITY:
        util = utilities(goodput, allowed, gpn, max_nodes)
        now = util[min(max(current, 1), max_nodes) - 1]
        if config.low <= now <= config.high:
            want = current
        else:  # nearest the middle; the larger size on a tie
            gap = np.abs(util - (config.low + config.high) / 2)
            want = int(np.flatnonzero(gap <= gap.min() + 1e-12)[-1]) + 1
    else:
        if config.rule is ScaleRule.PRICE:
            seen = np.array([max(j.max_replicas_seen, j.peer_max_replicas) for j in jobs])
            held = np.array([j.allocation.replicas if j.allocation else 0 for j in jobs])
            gpus = hopeful_worth(goodput, allowed, seen, config.price, held)
        else:
            gpus = _demand_gpus(goodput, allowed, config.efficiency)
        want = math.ceil(int(gpus.sum()) / gpn)
    return min(max(want, min_nodes), max_nodes)
