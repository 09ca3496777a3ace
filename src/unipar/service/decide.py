"""One scheduling round of the live service: jobs' reports in, worker counts out (pure).

The policy is a :mod:`unipar.sched` policy, the same object ``unipar simulate`` drives.
Workers stand for the policy's GPUs (one Ray worker of ``cpus_per_worker`` CPUs each) on
one node of ``slots`` workers: Ray places the workers. Each job's throughput model is
fitted (:func:`unipar.goodput.throughput.fit`, Pollux §3.2) on the mean seconds per step of
batch M0's progress it reported at each size (:mod:`unipar.service.ledger`). For an
adaptive job that has not yet reported its gradient statistics, that is its measured
goodput, statistical efficiency included; so the policy is given efficiency 1
(``grad_sqr=1, grad_var=0``) lest it count efficiency twice. Once it has, the policy sees
its statistics and a model fitted on the batches it ran, and chooses its workers and
batch together (:mod:`unipar.service.decide_batch`). The policy's counts are then
fitted to what a job can run on: a size its plan takes (``sizes``), at least its minimum
for a running job, at most its present size for a running job (grows come next), and the
workers left idle handed out shortest remaining time first, to a job starting up to its
maximum, to a running one only where growing pays for its measured cost (:func:`targets`;
the goodput policy alone explores at most twice the size a job has been seen at, Pollux
§4.1).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from unipar.errors import ConfigError
from unipar.goodput.throughput import Observation, ThroughputModel, fit
from unipar.sched.autoscale import useful_gpus
from unipar.sched.cluster import Cluster
from unipar.sched.policy import Allocation, JobView, Policy, RoundState
from unipar.service.decide_batch import batch_for, goodput_view, reported_goodput
from unipar.service.state import JobRow, JobState

PRIORITY_S = 86_400.0  # a priority of N queues a job as if submitted N days earlier


@dataclass(frozen=True)
class ResizeCost:
    """What growing a running job costs, as measured on the cluster (the runners report
    it; these defaults stand until they have): ``latency`` seconds from the decision to
    the gang running at the new size (its new workers start while the gang trains on),
    ``pause`` seconds the gang trains no step while it re-forms (the restart seconds δ
    of Pollux §4.1)."""

    latency: float = 5.0  # a worker process's start (imports, dataset): 4-6 s measured here
    pause: float = 1.0  # stop at a step boundary, re-plan, re-form: 0.5-1.2 s measured here

    def __post_init__(self) -> None:
        for name in ("latency", "pause"):
            value = getattr(self, name)
            if not value >= 0:
                raise ConfigError(f"ResizeCost.{name} must be >= 0 seconds, but got {value}; "
                                  "pass the seconds measured")

    @classmethod
    def measured(cls, latencies: Sequence[float], pauses: Sequence[float]) -> ResizeCost:
        """The medians of what runners measured (a default where none was)."""
        default = cls()
        return cls(float(np.median(latencies)) if len(latencies) else default.latency,
                   float(np.median(pauses)) if len(pauses) else default.pause)


def worker_sizes(least: int, most: int, batch: int) -> tuple[int, ...]:
    """The worker counts from ``least`` to ``most`` that a data-parallel run of global
    batch ``batch`` takes (the batch splits evenly over the workers)."""
    sizes = tuple(n for n in range(least, most + 1) if batch % n == 0)
    if not sizes:
        raise ConfigError(
            f"workers {least}:{most} holds no count that divides the global batch "
            f"{batch}; use a range that holds one of "
            f"{[n for n in range(1, batch + 1) if batch % n == 0][:8]}"
        )
    return sizes


def observations(row: JobRow, gpu_type: str | None = None) -> list[Observation]:
    """The mean seconds per step of M0's progress at each size the job ran at (on workers
    of node type ``gpu_type``; ``None``: on any)."""
    times = (row.step_times if gpu_type is None
             else (row.typed_step_times or {}).get(gpu_type)) or {}
    return [
        Observation(nodes=1, replicas=k, local_bsz=row.batch / k, step_time=sec / n,
                    sync_time=0.0)
        for k, (n, sec) in sorted(times.items())
        if n > 0
    ]


def fitted_model(rows: Sequence[JobRow], gpu_type: str | None = None) -> ThroughputModel | None:
    """Pollux's model fitted on the jobs' step times (on node type ``gpu_type``; ``None``:
    on any). With a fixed global batch one
    worker always runs the whole batch, so Pollux's compute line (fitted on single-worker
    steps) would see one per-worker batch only; once sizes differ, the line
    T = α + β·m is fitted over every size's per-worker batch m = M/k instead (least
    squares, α, β ≥ 0; synchronisation folded into it)."""
    seen = [o for r in rows for o in observations(r, gpu_type)]
    if len({o.local_bsz for o in seen}) < 2:
        return fit(seen) if seen else None
    m = np.array([o.local_bsz for o in seen])
    t = np.array([o.step_time for o in seen])
    beta, alpha = np.polyfit(m, t, 1)
    if beta < 0:  # no faster on more workers: flat
        alpha, beta = float(np.mean(t)), 0.0
    elif alpha < 0:
        alpha, beta = 0.0, float(np.sum(m * t) / np.sum(m * m))
    return ThroughputModel(float(alpha), float(beta))


def job_view(row: JobRow, now: float, peers: Sequence[JobRow]) -> JobView:
    """``row`` as the policy sees it; ``peers``: jobs of the same name (application)."""
    running = row.state is JobState.RUNNING and row.target > 0
    view = JobView(
        name=str(row.id),
        submit_time=row.submitted - PRIORITY_S * row.priority,
        requested_replicas=max(row.sizes),
        requested_batch=row.batch,
        init_batch=row.batch,
        max_batch=2 * row.batch,
        min_local=1,
        max_local=row.batch,
        progress=float(row.step),
        attained_service=row.worker_seconds,
        run_time=now - row.started if row.started else 0.0,
        restarts=row.restarts,
        max_replicas_seen=row.max_seen,
        allocation=Allocation(((0, row.target),), max(1, row.batch // row.target))
        if running else None,
        model=fitted_model([row]),
        grad_sqr=1.0,
        grad_var=0.0,
        user=row.user,
        peer_model=fitted_model(peers),
        peer_max_replicas=max((p.max_seen for p in peers), default=0),
        deadline=row.deadline,
        remaining_progress=float(row.steps - row.step),
    )
    return goodput_view(view, row) if reported_goodput(row) else view


def decided_batches(rows: Sequence[JobRow], counts: dict[int, int], now: float,
                    slots: int) -> dict[int, int]:
    """The global batch of each adaptive job that reported its goodput and runs on
    ``counts[id]`` workers: the policy's best at that count (:func:`batch_for`)."""
    out = {}
    for r in rows:
        if counts.get(r.id, 0) > 0 and reported_goodput(r):
            peers = [p for p in rows if p.name == r.name]
            batch = batch_for(job_view(r, now, peers), counts[r.id], slots)
            if batch:
                out[r.id] = batch
    return out


def _measured(row: JobRow) -> dict[int, float]:
    """The mean seconds per step of M0's progress ``row`` reported at each size it ran at."""
    return {k: sec / n for k, (n, sec) in (row.step_times or {}).items() if n > 0}


def step_time(row: JobRow, workers: int) -> float | None:
    """Seconds per step of ``row`` on ``workers``: the mean it reported there, else its
    fitted model's prediction, or, seen at one size only, that size's time scaled
    perfectly (optimistic, as Pollux explores, §4.1: one try measures it); ``None``
    before it reported any."""
    seen = _measured(row)
    if workers in seen:
        return seen[workers]
    if len(seen) == 1:
        (k, t), = seen.items()
        return t * k / workers
    model = fitted_model([row])
    if model is None:
        return None
    return float(model.iter_time(1, workers, row.batch / workers))


def grow_pays(row: JobRow, workers: int, cost: ResizeCost) -> bool:
    """Whether growing running ``row`` to ``workers`` finishes it sooner: the steps left
    once the new workers are up (``cost.latency`` on, at the present speed) run faster by
    more than the re-formation's pause (the test of ``restart_by_remaining`` in the
    goodput policy, made exact for one job with the measured cost). Unknown speeds: yes."""
    now_t, new_t = step_time(row, row.target), step_time(row, workers)
    if now_t is None or new_t is None:
        return True
    left = row.steps - row.step - cost.latency / max(now_t, 1e-9)
    return left * (now_t - new_t) > cost.pause


def remaining_s(row: JobRow) -> float:
    """Predicted seconds left at the job's present size (``inf`` when unknown)."""
    t = step_time(row, max(row.target, 1))
    return float("inf") if t is None else (row.steps - row.step) * t


def srpt_order(rows: Sequence[JobRow]) -> list[JobRow]:
    """``rows``, the least time left first. A job that has reported no step time yet (it
    has just started) is ranked by its steps left at the median step time the others
    reported at its size (a prior until it is measured; ``inf`` without one), not last
    behind every job measured."""
    measured = [_measured(r) for r in rows]

    def prior(size: int) -> float | None:
        seen = [m[size] for m in measured if size in m]
        return float(np.median(seen)) if seen else None

    def left(row: JobRow) -> float:
        size = max(row.target, 1)
        t = step_time(row, size)
        t = prior(size) if t is None else t
        return float("inf") if t is None else (row.steps - row.step) * t

    return sorted(rows, key=lambda r: (left(r), r.steps - r.step))


def down_to(sizes: Sequence[int], count: int) -> int:
    """The largest size up to ``count`` (0 when none)."""
    return max((s for s in sizes if s <= count), default=0)


def targets(
    policy: Policy,
    rows: Sequence[JobRow],
    slots: int,
    now: float,
    interval_s: float,
    cost: ResizeCost = ResizeCost(),
) -> dict[int, int]:
    """Workers for each queued or running job (0: stays queued) on ``slots`` workers.

    The policy's counts start queued jobs and shrink running ones; running jobs grow
    only out of the workers left over, the one with the least time left first (shortest
    remaining time first: the order that minimises mean completion time, Schrage 1968),
    each only where growing finishes it sooner (:func:`grow_pays`, with the measured
    ``cost``). A job about to end is not shrunk (:func:`_keep_finishers`)."""
    live = [r for r in rows if not r.state.ended]
    if not live or slots < 1:
        return {r.id: r.target for r in live}
    usable = {r.id: tuple(s for s in r.sizes if s <= slots) for r in live}
    views = [job_view(r, now, [p for p in rows if p.name == r.name]) for r in live]
    state = RoundState(now=now, cluster=Cluster.uniform(1, slots), jobs=views,
                       available_nodes=(0,), restart_seconds=cost.pause, interval=interval_s)
    wanted = {int(name): a.replicas for name, a in policy.allocate(state).items()}
    order = sorted(live, key=lambda r: (r.target == 0, r.submitted - PRIORITY_S * r.priority))
    out: dict[int, int] = {}
    free = slots
    for r in order:  # running jobs first, then the queue in order
        sizes = usable[r.id]
        count = down_to(sizes, wanted.get(r.id, 0))
        if r.target == 0 and wanted.get(r.id, 0) > 0 and sizes:  # started: its least size
            count = max(count, sizes[0])
        if r.target > 0:  # a running job keeps at least its least size
            count = max(count, sizes[0] if sizes else r.target)
            count = min(count, r.target)  # grows: below, shortest remaining first
        if count > free:
            count = down_to(sizes, free) if r.target > 0 else 0
        out[r.id] = count
        free -= count
    waiting = _make_room(order, usable, wanted, out, slots)
    free = slots - sum(out.values())
    for r in srpt_order(order):  # shortest remaining time first
        if out[r.id] == 0 or (waiting and r.target > 0):  # the room is kept for the queue
            continue
        bigger = [s for s in usable[r.id] if out[r.id] < s <= out[r.id] + free
                  and (r.target == 0 or s <= r.target or grow_pays(r, s, cost))]
        if bigger:
            free -= max(bigger) - out[r.id]
            out[r.id] = max(bigger)
    _keep_finishers(live, out, cost)
    return out


def _keep_finishers(live: Sequence[JobRow], out: dict[int, int], cost: ResizeCost) -> None:
    """A running job that ends, at its present size, within ``cost.latency`` (the
    soonest the room it would give can be used: a new worker's start) keeps its size
    (``out`` changed in place): shrinking it would pause and slow it for nothing. The
    jobs given its room take it when it ends (their workers wait for it meanwhile)."""
    for r in live:
        if 0 < out[r.id] < r.target and remaining_s(r) <= cost.latency:
            out[r.id] = r.target


def _make_room(
    order: Sequence[JobRow],
    usable: dict[int, tuple[int, ...]],
    wanted: dict[int, int],
    out: dict[int, int],
    slots: int,
) -> bool:
    """The first queued job the policy starts but whose least size does not fit the free
    workers: running jobs shrink toward their least sizes for it, the one with the most
    time left first, and it starts (``out`` changed in place). Whether it still waits
    (running jobs then do not grow into the room it needs)."""
    for r in order:
        if r.target > 0 or out[r.id] or not wanted.get(r.id) or not usable[r.id]:
            continue
        least = usable[r.id][0]
        need = least - (slots - sum(out.values()))
        shrunk = dict(out)
        for j in sorted((j for j in order if j.target > 0 and out[j.id]),
                        key=remaining_s, reverse=True):
            if need <= 0:
                break
            smaller = max(down_to(usable[j.id], shrunk[j.id] - need), usable[j.id][0])
            need -= shrunk[j.id] - smaller
            shrunk[j.id] = smaller
        if need > 0:
            return True
        out.update(shrunk)
        out[r.id] = least
        return False
    return False


def useful_workers(rows: Sequence[JobRow], now: float, max_workers: int) -> int:
    """Workers the live jobs would use well (Pollux's cloud mode, §4.3: each job up to the
    size where its goodput per worker is still half its goodput on one, at most its most):
    what the scheduler asks Ray's autoscaler for."""
    live = [r for r in rows if not r.state.ended]
    if not live:
        return 0
    views = [job_view(r, now, [p for p in rows if p.name == r.name]) for r in live]
    useful = useful_gpus(views, max_workers, max_workers)
    return int(sum(down_to(r.sizes, int(k)) or r.sizes[0] for r, k in zip(live, useful,
                                                                         strict=True)))
