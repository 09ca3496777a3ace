"""A floor under the cost of any schedule of a workload, for a given average JCT.

Relaxation of the simulator's setting (ground truth: the measured traces): every job runs
from its submission with no queue, no restart and no other job in its way, on any number
of GPUs, chosen per epoch, at the best per-GPU batch, accumulation and measured placement
(total batch within the measured range M0..M_max, as the policies keep it; a finer grid,
LOCAL_STEPS x ACCUM_STEPS, than the policies' own search);
nodes are billed per GPU used (no part-empty node). Any real schedule is no better on
either count, so for every λ ≥ 0 it has Σ JCT + λ·GPU-seconds ≥ min over the relaxation,
which splits per job and per epoch: pick k minimising (1 + λ·k)·Δprogress / goodput(k).
The least GPU-seconds of a schedule with Σ JCT ≤ B is then at least
max_λ (L(λ) − B) / λ (Lagrangian duality).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

import numpy as np

from unipar.sched.traces import Application
from unipar.sched.workload import JobSpec

LOCAL_STEPS = 48  # per-GPU batch candidates (geometric)
ACCUM_STEPS = 12  # accumulation steps searched


def _placements(app: Application, k: int, gpn: int) -> set[tuple[int, ...]]:
    full, rest = divmod(k, gpn)
    out = {(gpn,) * full + ((rest,) if rest else ())}
    out |= {tuple(map(int, key)) for key in app.placements if sum(map(int, key)) == k}
    return out


def best_goodput(app: Application, max_gpus: int, gpn: int) -> np.ndarray:
    """(epochs, max_gpus): the most progress per second on k GPUs during each epoch."""
    local = np.unique(np.round(np.geomspace(app.min_local_bsz, app.max_local_bsz, LOCAL_STEPS)))
    accum = np.arange(ACCUM_STEPS)
    epochs = np.arange(app.epochs)
    stats = []  # per measured run: (sqr, var) per epoch, the last row past its end
    for v in app.validations:
        rows = np.minimum(epochs, len(v.progress) - 1)
        stats.append((v.grad_sqr[rows], v.grad_var[rows]))
    logs = np.log([v.batch for v in app.validations])
    out = np.zeros((app.epochs, max_gpus))
    for k in range(1, max_gpus + 1):
        for placement in _placements(app, k, gpn):
            times = np.array([app.step_time(placement, int(m)) for m in local])  # (L, 2)
            t = times[:, :1] + (times[:, :1] - times[:, 1:]) * accum[None, :]  # (L, S)
            batch = k * local[:, None] * (accum[None, :] + 1)
            ok = (batch >= app.init_batch) & (batch <= app.max_batch)
            if not ok.any():
                continue
            run = np.argmin(np.abs(logs[:, None, None] - np.log(batch)[None]), axis=0)
            scale = batch / app.init_batch
            for r, (sqr, var) in enumerate(stats):
                mine = ok & (run == r)
                if not mine.any():
                    continue
                s, tt = scale[mine], t[mine]
                gain = (var[:, None] + sqr[:, None]) / (var[:, None] / s[None] + sqr[:, None])
                out[:, k - 1] = np.maximum(out[:, k - 1], (gain / tt[None]).max(axis=1))
    return out


class CostFloor:
    """The relaxation for one workload: its per-application goodput tables and counts."""

    def __init__(
        self, specs: Sequence[JobSpec], applications: dict[str, Application],
        max_gpus: int = 64, gpus_per_node: int = 4,
    ) -> None:
        self.count = Counter(s.application for s in specs)
        self.apps = {a: applications[a] for a in self.count}
        self.tables = {a: best_goodput(app, max_gpus, gpus_per_node)
                       for a, app in self.apps.items()}

    def relaxed(self, price: float) -> tuple[float, float]:
        """(Σ JCT, GPU-seconds) of the relaxation's best schedule at λ = ``price``."""
        jct = gpu_s = 0.0
        for a, app in self.apps.items():
            g = self.tables[a]
            k = np.arange(1, g.shape[1] + 1)
            with np.errstate(divide="ignore"):
                per = np.where(g > 0, app.progress_per_epoch / g, np.inf)  # seconds per epoch
            best = np.argmin(per * (1.0 + price * k[None, :]), axis=1)
            secs = per[np.arange(len(g)), best]
            jct += self.count[a] * secs.sum()
            gpu_s += self.count[a] * (secs * k[best]).sum()
        return jct, gpu_s

    def gpu_seconds(self, jct_budget: float, prices: Sequence[float] | None = None) -> float:
        """At least this many GPU-seconds for any schedule whose Σ JCT is ≤ ``jct_budget``."""
        prices = np.geomspace(1e-3, 10.0, 120) if prices is None else prices
        best = 0.0
        for lam in prices:
            jct, gpu_s = self.relaxed(lam)
            best = max(best, (jct + lam * gpu_s - jct_budget) / lam)
        return best
