"""Trace-driven simulation of a cluster of several GPU types, round by round (Sia's setting).

Every ``interval`` seconds the policy puts each job on GPUs of one type (or none). A job
whose GPU type or shape (GPUs per node) changes spends its application's checkpoint-restore
seconds without progress; moved to other nodes of the same shape, it trains on (Sia's rule).
In between it trains epoch by epoch at its measured speed on its type (Sia's simulator,
``job.py``): per epoch, seconds per step from the traces for its placement, per-GPU batch
and accumulation; progress per step (in steps at M0) from the measured gradient
statistics of that epoch at its batch; real progress is that over the application's
slowdown (Sia's calibration to real runs). At every start and every epoch the job's
runtime picks its batch for its GPUs (:mod:`unipar.goodput.batch`, AdaptDL's search) with
the throughput model the policy names. A job ends after its declared epochs.

Policies see only what jobs report: the step times of the configurations they ran (to
which each job fits Pollux's throughput model per type, and over all types as one, as
Pollux's runtime fits it: :mod:`unipar.goodput.fit_log`), the
gradient statistics of their last epoch, the models pooled over jobs of the same
application per type, and each new job's one-GPU throughput per type (Sia profiles a new
job on one GPU of each type; here that profile is free).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field

import numpy as np

from unipar.errors import ConfigError
from unipar.goodput.batch import best_batch
from unipar.goodput.fit_log import fit_log
from unipar.goodput.throughput import Observation, ThroughputModel
from unipar.sched.arrivals import admit_arrivals
from unipar.sched.results import SimResult, job_results
from unipar.sched.typed_cluster import TypedAllocation, TypedCluster
from unipar.sched.typed_policy import (
    BatchModel,
    LocalLimits,
    TypedJobView,
    TypedPolicy,
    TypedRoundState,
)
from unipar.sched.typed_traces import TypedApplication
from unipar.sched.workload import JobSpec

_EPS = 1e-8


class _Models:
    """Observations by key, first report kept, and the model fitted on them (Pollux's
    runtime's fit, :func:`unipar.goodput.fit_log.fit_log`, from the last fit).

    AdaptDL refits on every new report; here the model is refitted only for a new spread
    (nodes, GPUs) or a quarter more observations than the last fit had: later reports
    differ only in the per-GPU batch, and a quarter more of them moves the fit little,
    while fits were most of the simulation's time.
    """

    def __init__(self) -> None:
        self.observed: dict[tuple, Observation] = {}
        self.seen = 0
        self._model: ThroughputModel | None = None
        self._spreads: set[tuple[int, int]] = set()
        self._fitted_on = 0
        self._dirty = False

    def add(self, key: tuple, obs: Observation) -> None:
        if key in self.observed:
            return
        self.observed[key] = obs
        self.seen = max(self.seen, obs.replicas)
        spread = (obs.nodes, obs.replicas)
        if spread not in self._spreads or len(self.observed) >= 1.25 * self._fitted_on:
            self._dirty = True
        self._spreads.add(spread)

    @property
    def model(self) -> ThroughputModel | None:
        if self._dirty:
            self._model = fit_log(list(self.observed.values()), start=self._model)
            self._fitted_on = len(self.observed)
            self._dirty = False
        return self._model


@dataclass
class _Job:
    spec: JobSpec
    app: TypedApplication
    epoch: int = 0
    progress: float = 0.0
    allocation: TypedAllocation | None = None
    local_bsz: int = 0
    accum: int = 0
    restart_left: float = 0.0
    own: dict[str, _Models] = field(default_factory=dict)
    merged: _Models = field(default_factory=_Models)
    grad: tuple[float, float] | None = None
    attained: float = 0.0  # GPU-seconds held while a round ran (restarts included)
    restarts: int = 0
    migrations: int = 0
    preemptions: int = 0  # never: a job is moved (a migration), not preempted
    start: float | None = None
    finish: float | None = None
    _last_choice: tuple = (None, (0, 0))

    def view(self, pools: dict, types: tuple[str, ...]) -> TypedJobView:
        app = self.app
        traces = {t: app.traces[t] for t in types}
        pooled = {t: pools[(app.name, t)] for t in types if (app.name, t) in pools}
        return TypedJobView(
            name=self.spec.name,
            application=app.name,
            submit_time=self.spec.submit_time,
            requested_replicas=self.spec.num_replicas,
            requested_batch=self.spec.batch_size,
            init_batch=app.init_batch,
            max_batch=app.max_batch,
            limits={t: LocalLimits(tr.min_local, tr.max_local) for t, tr in traces.items()},
            restart_seconds=app.restart_seconds,
            epoch=self.epoch,
            progress=self.progress,
            remaining_progress=app.target_progress - self.progress,
            attained_service=self.attained,
            restarts=self.restarts,
            restart_left=self.restart_left,
            allocation=self.allocation,
            grad=self.grad,
            models={t: m.model for t, m in self.own.items() if m.observed},
            seen={t: m.seen for t, m in self.own.items()},
            merged_model=self.merged.model,
            merged_seen=self.merged.seen,
            pooled_models={t: p.model for t, p in pooled.items()},
            pooled_seen={t: p.seen for t, p in pooled.items()},
            profile={t: tr.one_gpu_throughput for t, tr in traces.items()},
        )

    def assign(self, new: TypedAllocation | None, now: float, rule: BatchModel,
               pools: dict) -> None:
        old = self.allocation
        if new is None or (old is not None and old.gpu_type == new.gpu_type
                           and _shape(old) == _shape(new)):
            self.allocation = new  # other nodes of the same shape: no restart (see _shape)
            return
        if self.start is None:
            self.start = now
        else:
            self.restarts += 1
        if old is not None and old.gpu_type != new.gpu_type:
            self.migrations += 1
        self.allocation = new
        self.restart_left = self.app.restart_seconds
        self._choose_batch(rule, pools)

    def _model(self, rule: BatchModel, pools: dict) -> ThroughputModel | None:
        gpu_type = self.allocation.gpu_type
        own = self.own.get(gpu_type)
        if rule is BatchModel.MERGED:
            return self.merged.model
        if rule is BatchModel.POOLED and (self.app.name, gpu_type) in pools:
            return pools[(self.app.name, gpu_type)].model
        return own.model if own else None

    def _choose_batch(self, rule: BatchModel, pools: dict) -> None:
        """Per-GPU batch and accumulation for the job's GPUs (Sia's ``update_local_bsz``)."""
        app, a = self.app, self.allocation
        trace = app.trace(a.gpu_type)
        placement = a.placement
        k, nodes = a.replicas, len(placement)
        limit = trace.max_local_for(placement)
        model = self._model(rule, pools)
        key = (model, self.grad, placement, a.gpu_type)
        if key == self._last_choice[0]:  # same model, statistics and GPUs: same batch
            self.local_bsz, self.accum = self._last_choice[1]
            return
        if model is None or self.grad is None:  # nothing measured: the smallest batch
            batch = max(app.init_batch, trace.min_local * k)
            local = math.ceil(batch / k - _EPS)
            accum = math.ceil(local / limit - _EPS) - 1
            if k == 1 and batch > app.init_batch:
                accum = max(1, accum)
            atomic = math.ceil(local / (accum + 1) - _EPS)
        else:
            choice = best_batch(model.as_array(), *self.grad, app.init_batch, app.max_batch,
                                trace.min_local, limit, nodes, k)
            atomic, accum = int(choice.local_bsz), int(choice.accum)
        atomic = min(atomic, trace.replica_max_local.get(k, atomic))
        atomic = min(atomic, int(app.max_batch / (k * (accum + 1))))
        self.local_bsz, self.accum = max(atomic, 1), accum
        self._last_choice = (key, (self.local_bsz, self.accum))

    def advance(self, now: float, interval: float, rule: BatchModel, pools: dict) -> None:
        a = self.allocation
        if a is None:
            return
        app, k = self.app, a.replicas
        trace = app.trace(a.gpu_type)
        placement = a.placement
        self.attained += k * interval
        busy = min(self.restart_left, interval)
        self.restart_left -= busy
        t, left = now + busy, interval - busy
        while left > 1e-9 and self.finish is None:
            batch = k * self.local_bsz * (self.accum + 1)
            sqr, var = app.grad_stats(batch, self.epoch)
            scale = batch / app.init_batch
            gain = (var + sqr) / (var / scale + sqr)
            step, sync = trace.step_time(placement, self.local_bsz)
            self._observe(a.gpu_type, len(placement), k, step, sync, pools)
            self.grad = (sqr, var)
            rate = gain / (step + (step - sync) * self.accum) / app.slowdown
            end = app.progress_at(self.epoch + 1)
            if self.progress + rate * left < end:
                self.progress += rate * left
                left = 0.0
            else:
                spent = (end - self.progress) / rate
                self.epoch += 1
                self.progress = end
                t += spent
                left -= spent
                if self.epoch >= app.epochs:
                    self.finish = t
            self._choose_batch(rule, pools)

    def _observe(self, gpu_type: str, nodes: int, k: int, step: float, sync: float,
                 pools: dict) -> None:
        key = (nodes, k, self.local_bsz)
        obs = Observation(nodes, k, self.local_bsz, step, sync)
        self.own.setdefault(gpu_type, _Models()).add(key, obs)
        self.merged.add(key, obs)
        pools.setdefault((self.app.name, gpu_type), _Models()).add(key, obs)


def _shape(a: TypedAllocation) -> tuple[int, ...]:
    """GPUs per node, largest first: what a restart is counted on.

    Sia's simulator restarts a job only when this changes or its GPU type does (``job.py``,
    ``Job.reallocate`` compares the placement tuple of GPUs per node, not node ids;
    ``Job.migrate`` on a type change); the same shape on other nodes of the type keeps
    training. The step time depends only on the shape too (``applications.py``,
    ``get_throughput``)."""
    return tuple(sorted((g for _, g in a.nodes), reverse=True))


def _check(allocs: dict[str, TypedAllocation], jobs: dict[str, _Job],
           cluster: TypedCluster) -> None:
    used: dict[int, int] = {}
    for name, a in allocs.items():
        job = jobs.get(name)
        if job is None:
            raise ConfigError(f"policy allocated GPUs to {name!r}, which is not waiting or running")
        if a.gpu_type not in job.app.traces:
            raise ConfigError(f"policy put {name!r} on GPU type {a.gpu_type!r}, which its "
                              f"application {job.app.name!r} has no trace for")
        allowed = cluster.nodes_of(a.gpu_type)
        for n, g in a.nodes:
            if n not in allowed or g < 1:
                raise ConfigError(f"policy put {name!r} on node {n} x{g}, not a "
                                  f"{a.gpu_type} node of the cluster")
            used[n] = used.get(n, 0) + g
    over = {n: g for n, g in used.items() if g > cluster.type_of(n).gpus_per_node}
    if over:
        raise ConfigError(f"policy oversubscribed nodes {over}")


@dataclass(frozen=True)
class TypedSimConfig:
    interval: float = 60.0  # seconds between scheduling rounds (Sia §6.1: 60 s)
    horizon: float = 60 * 24 * 3600.0  # stop (and fail) past this simulated time


@dataclass(frozen=True)
class TypedRun:
    """A simulated run: the common results, and what only a typed cluster has."""

    result: SimResult
    round_seconds: np.ndarray  # the policy's time per round, wall clock
    migrations: int  # moves from one GPU type to another
    gpu_seconds_by_type: dict[str, float]


def simulate_typed(
    specs: list[JobSpec],
    applications: dict[str, TypedApplication],
    policy: TypedPolicy,
    cluster: TypedCluster,
    config: TypedSimConfig = TypedSimConfig(),
) -> TypedRun:
    """Run ``specs`` under ``policy`` on ``cluster`` until every job is done.

    BLAS runs on one thread meanwhile: the model fits are of 7 parameters, on which
    OpenBLAS's threads only contend (on 2 busy cores the fits took 9x the CPU)."""
    with _one_blas_thread():
        return _simulate(specs, applications, policy, cluster, config)


def _one_blas_thread():
    """A context that keeps BLAS (numpy's and scipy's) on one thread."""
    try:
        import scipy.optimize  # noqa: F401, PLC0415 (heavy: scipy, the sched extra; loaded first so its BLAS is limited too)
        from threadpoolctl import threadpool_limits  # noqa: PLC0415 (the sched extra)
    except ImportError:
        raise ConfigError(
            "simulating a cluster of several GPU types needs scipy and threadpoolctl: "
            "pip install 'unipar[sched]'"
        ) from None
    return threadpool_limits(1, user_api="blas")


def _simulate(specs, applications, policy, cluster, config) -> TypedRun:
    types = cluster.type_names
    jobs = {s.name: _Job(s, applications[s.application]) for s in specs}
    pending = sorted(jobs.values(), key=lambda j: j.spec.submit_time)
    active: list[_Job] = []
    done: list[_Job] = []
    interval = config.interval
    now = math.floor(pending[0].spec.submit_time / interval) * interval
    start = now
    pools: dict[tuple[str, str], _Models] = {}
    timeline: list[tuple[float, dict[str, int]]] = []
    round_seconds: list[float] = []
    by_type = dict.fromkeys(types, 0.0)
    while pending or active:
        skip_to = admit_arrivals(pending, active, now, interval, config.horizon, hint="")
        if skip_to is not None:
            now = skip_to
            continue
        state = TypedRoundState(now, cluster, [j.view(pools, types) for j in active], interval)
        tick = time.perf_counter()
        allocs = policy.allocate(state)
        round_seconds.append(time.perf_counter() - tick)
        _check(allocs, {j.spec.name: j for j in active}, cluster)
        snapshot = {}
        for job in active:
            job.assign(allocs.get(job.spec.name), now, policy.batch_model, pools)
            if job.allocation is not None:
                snapshot[job.spec.name] = job.allocation.replicas
                by_type[job.allocation.gpu_type] += job.allocation.replicas * interval
            job.advance(now, interval, policy.batch_model, pools)
        timeline.append((now, snapshot))
        now += interval
        done += [j for j in active if j.finish is not None]
        active = [j for j in active if j.finish is None]
    prices = {t.name: t.price_per_hour or 0.0 for t in cluster.types}
    node_hours = {t.name: len(cluster.nodes_of(t.name)) * (now - start) / 3600 for t in
                  cluster.types}
    result = SimResult(
        policy=policy.name,
        jobs=job_results(done),
        gpu_seconds=sum(by_type.values()),
        timeline=tuple(timeline),
        cost=sum(prices[t] * h for t, h in node_hours.items()),
        node_seconds=cluster.total_gpus * (now - start),  # as GPU-seconds: see gpus_per_node
        gpus_per_node=1,
    )
    return TypedRun(result, np.array(round_seconds), sum(j.migrations for j in done), by_type)
