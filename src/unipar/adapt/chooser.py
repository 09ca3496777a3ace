"""The batch and accumulation that maximise predicted goodput, from a job's own reports.

Throughput model: Pollux's T_iter (Qiao et al. 2021, eqs. 8-10), fitted online from the
step times the job sees (:func:`unipar.goodput.throughput.fit`), chosen over the planner's
calibrated cost model because it is fitted to the very steps the job runs (overlap,
input pipeline and all), and the cost model is already behind the plan the batch runs
on. Goodput = throughput × statistical efficiency (Pollux eq. 2), searched by
:func:`unipar.goodput.table.goodput_table`, the same search the cluster scheduler uses.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from unipar.adapt.lr import efficiency, var_at_init
from unipar.adapt.noise import NoiseEstimate
from unipar.goodput.table import JobArrays, goodput_table
from unipar.goodput.throughput import Observation, ThroughputModel, fit


@dataclass(frozen=True)
class BatchChoice:
    """A global batch ``replicas × local_batch × accum_steps`` and what it is predicted
    to give: optimizer steps per second, statistical efficiency and goodput (steps of
    batch M0 per second). ``by_workers[k]`` is the best goodput on k+1 workers."""

    global_batch: int
    local_batch: int
    accum_steps: int
    step_time: float
    efficiency: float
    goodput: float
    by_workers: tuple[float, ...]
    fit_error: float = 0.0  # the throughput model's RMS relative error on the steps seen


def fit_error(model: ThroughputModel, observations: Sequence[Observation]) -> float:
    """Root mean square relative error of the model's step times on the observations."""
    o = np.array(
        [[x.nodes, x.replicas, x.local_bsz, x.step_time, x.accum] for x in observations]
    )
    pred = model.iter_time(o[:, 0], o[:, 1], o[:, 2], o[:, 4])
    return float(np.sqrt(np.mean((pred / o[:, 3] - 1.0) ** 2)))


def per_shape(observations: Sequence[Observation]) -> list[Observation]:
    """One observation per shape (nodes, replicas, per-GPU batch, accumulation steps):
    the mean step and sync times seen at it (the mean, not the median: time to a goal
    adds step times, stalls of a shared machine included). Each shape weighs the same in
    the fit, however many steps ran at it, and the fit costs the same however long the
    run."""
    by_shape: dict[tuple[int, int, float, int], list[Observation]] = {}
    for o in observations:
        by_shape.setdefault((o.nodes, o.replicas, o.local_bsz, o.accum), []).append(o)
    return [
        Observation(n, r, m, float(np.mean([o.step_time for o in seen])),
                    float(np.mean([o.sync_time for o in seen])), s)
        for (n, r, m, s), seen in by_shape.items()
    ]


def choose(
    observations: Sequence[Observation],
    noise: NoiseEstimate,
    *,
    init_batch: int,
    max_batch: int,
    replicas: int,
    max_local: int,
    nodes: int = 1,
    max_workers: int | None = None,
    min_batch: int | None = None,
) -> BatchChoice:
    """The goodput-optimal batch on ``replicas`` workers, each running at most
    ``max_local`` samples per micro-batch; ``min_batch ≤ batch ≤ max_batch``
    (``min_batch`` None: ``init_batch``). The
    throughput model is fitted on the mean step time of each shape seen; every
    per-GPU batch up to ``max_local`` is a candidate (one job: the search is cheap).
    A shape already timed on these replicas is judged by its measured time, not the
    model's (measured beats modelled: a step time that is not linear in the per-GPU
    batch, as memory-bound kernels make it, bends away from the fitted line), and the
    model's pick stands only where it predicts more than every shape measured."""
    shapes = per_shape(observations)
    model = fit(shapes)
    most = max(replicas, max_workers or replicas)
    jobs = JobArrays(
        params=model.as_array()[None, :],
        grad_sqr=np.array([noise.sqr]),
        grad_var=np.array([var_at_init(noise.var, init_batch)]),  # Pollux's: at M0
        init_batch=np.array([float(init_batch)]),
        max_batch=np.array([float(max_batch)]),
        min_local=np.array([1.0]),
        max_local=np.array([float(max_local)]),
        fixed_batch=np.array([float(init_batch)]),
        adaptive=np.array([True]),
        min_batch=np.array([float(min_batch or init_batch)]),
    )
    table = goodput_table(
        jobs, most, gpus_per_node=max(1, most // nodes), local_grid=max(2, max_local)
    )
    k = replicas - 1
    local, accum = int(table.local_bsz[0, k]), int(table.accum[0, k])
    if table.goodput[0, k] <= 0:  # nothing in bounds on the grid: stay at M0
        local, accum = -(-init_batch // replicas), 0
    least = min_batch or init_batch
    timed = {(int(o.local_bsz), o.accum): o.step_time for o in shapes
             if o.replicas == replicas and o.nodes == nodes}
    candidates = [(local, accum, timed.get((local, accum),
                                           float(model.iter_time(nodes, replicas, local, accum))))]
    candidates += [(m, s, t) for (m, s), t in timed.items()
                   if m <= max_local and least <= replicas * m * (s + 1) <= max_batch]

    def goodput(shape: tuple[int, int, float]) -> float:
        m, s, t = shape
        total = replicas * m * (s + 1)
        return efficiency(total, init_batch, noise.sqr, noise.var) * total / init_batch / t

    local, accum, t = max(candidates, key=goodput)
    batch = replicas * local * (accum + 1)
    eff = efficiency(batch, init_batch, noise.sqr, noise.var)
    return BatchChoice(
        global_batch=batch,
        local_batch=local,
        accum_steps=accum + 1,
        step_time=t,
        efficiency=eff,
        goodput=eff * batch / init_batch / t,
        by_workers=tuple(float(g) for g in table.goodput[0]),
        fit_error=fit_error(model, observations),
    )
