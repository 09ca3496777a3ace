"""Trace-driven simulation of a shared cluster, round by round (Pollux §5.1's setting).

Every ``interval`` seconds the policy allocates GPUs; a job whose GPUs change (or that
starts) spends ``restart`` seconds without progress. In between, each running job advances
at its measured speed: seconds per step from the traces for its placement, per-GPU batch and
accumulation, and progress per step (gain, in steps at the initial batch) from the measured
gradient statistics at its progress. A job ends when its progress reaches its epochs. The
policy sees only what jobs report: the step times of the configurations they ran (to which
each job fits Pollux's throughput model) and their gradient statistics.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from unipar.errors import ConfigError
from unipar.goodput.table import split_batch
from unipar.goodput.throughput import Observation, ThroughputModel, fit
from unipar.sched.arrivals import admit_arrivals
from unipar.sched.cluster import Cluster
from unipar.sched.fleet import FixedFleet, Fleet
from unipar.sched.policy import Allocation, JobView, Policy, RoundState
from unipar.sched.results import SimResult, job_results
from unipar.sched.traces import Application
from unipar.sched.workload import JobSpec


@dataclass
class _Pool:
    """Step times reported by all jobs, pooled per application (a shared cluster sees the
    same model run many times); refitted when a new configuration is reported."""

    observed: dict = field(default_factory=dict)
    models: dict = field(default_factory=dict)
    max_replicas: dict = field(default_factory=dict)

    def add(self, app: str, key: tuple, obs: Observation) -> None:
        mine = self.observed.setdefault(app, {})
        if key in mine:
            return
        mine[key] = obs
        self.models[app] = fit(list(mine.values()))
        self.max_replicas[app] = max(self.max_replicas.get(app, 0), obs.replicas)


@dataclass
class _Job:
    spec: JobSpec
    app: Application
    progress: float = 0.0
    attained: float = 0.0
    run_time: float = 0.0
    restarts: int = 0
    restart_left: float = 0.0
    allocation: Allocation | None = None
    observed: dict = field(default_factory=dict)
    model: ThroughputModel | None = None
    max_seen: int = 0
    start: float | None = None
    finish: float | None = None
    preemptions: int = 0
    oracle_iter: np.ndarray | None = None

    def view(
        self, now: float, max_gpus: int, gpn: int, oracle: bool, pool: _Pool
    ) -> JobView:
        app, spec = self.app, self.spec
        sqr, var = app.grad_stats(self.batch_now, self.progress)
        rate = None
        if oracle:
            if self.oracle_iter is None:
                self.oracle_iter = self._iter_times(max_gpus, gpn)
            rate = app.gain(spec.batch_size, self.progress) / self.oracle_iter
        return JobView(
            name=spec.name,
            submit_time=spec.submit_time,
            requested_replicas=spec.num_replicas,
            requested_batch=spec.batch_size,
            init_batch=app.init_batch,
            max_batch=app.max_batch,
            min_local=app.min_local_bsz,
            max_local=app.max_local_bsz,
            progress=self.progress,
            attained_service=self.attained,
            run_time=self.run_time,
            restarts=self.restarts,
            max_replicas_seen=self.max_seen,
            allocation=self.allocation,
            model=self.model,
            grad_sqr=sqr,
            grad_var=var,
            user=spec.user,
            deadline=None if spec.deadline is None else spec.submit_time + spec.deadline,
            remaining_progress=app.target_progress - self.progress,
            oracle_rate=rate,
            peer_model=pool.models.get(spec.application),
            peer_max_replicas=pool.max_replicas.get(spec.application, 0),
        )

    @property
    def batch_now(self) -> float:
        return self.allocation.batch if self.allocation else self.spec.batch_size

    def _iter_times(self, max_gpus: int, gpn: int) -> np.ndarray:
        """Seconds per step of the requested batch on 1..max_gpus GPUs, fewest nodes."""
        out = np.empty(max_gpus)
        for k in range(1, max_gpus + 1):
            local, accum = split_batch(self.spec.batch_size, k, self.app.max_local_bsz)
            full, rest = divmod(k, gpn)
            placement = (gpn,) * full + ((rest,) if rest else ())
            step, sync = self.app.step_time(placement, local)
            out[k - 1] = step + (step - sync) * accum
        return out

    def advance(self, now: float, interval: float, pool: _Pool) -> None:
        a = self.allocation
        if a is None:
            return
        self.attained += a.replicas * interval
        self.run_time += interval
        busy = min(self.restart_left, interval)
        self.restart_left -= busy
        dt = interval - busy
        if dt <= 0:
            return
        placement = tuple(g for _, g in a.nodes)
        step, sync = self.app.step_time(placement, a.local_bsz)
        t_iter = step + (step - sync) * a.accum
        rate = self.app.gain(a.batch, self.progress) / t_iter
        mid = self.progress + rate * dt / 2  # gradient statistics change along the way
        rate = self.app.gain(a.batch, mid) / t_iter
        left = self.app.target_progress - self.progress
        if rate * dt >= left:
            self.finish = now + busy + left / rate
            self.progress = self.app.target_progress
        else:
            self.progress += rate * dt
        key = (len(a.nodes), a.replicas, a.local_bsz)
        if key not in self.observed:
            self.observed[key] = Observation(len(a.nodes), a.replicas, a.local_bsz, step, sync)
            self.model = fit(list(self.observed.values()))
        pool.add(self.spec.application, key, self.observed[key])


def _check(allocs: dict[str, Allocation], jobs: dict[str, _Job], state: RoundState) -> None:
    used: dict[int, int] = {}
    allowed = set(state.available_nodes)
    for name, a in allocs.items():
        job = jobs.get(name)
        if job is None:
            raise ConfigError(f"policy allocated GPUs to {name!r}, which is not waiting or running")
        for n, g in a.nodes:
            if n not in allowed or g < 1:
                raise ConfigError(f"policy put {name!r} on node {n} x{g}, not available")
            used[n] = used.get(n, 0) + g
        if a.local_bsz > job.app.max_local_bsz or a.local_bsz < 1:
            raise ConfigError(
                f"policy gave {name!r} a per-GPU batch of {a.local_bsz}, outside "
                f"1..{job.app.max_local_bsz}"
            )
    over = {n: g for n, g in used.items() if g > state.cluster.gpus_per_node}
    if over:
        raise ConfigError(f"policy oversubscribed nodes {over} (GPUs per node: "
                          f"{state.cluster.gpus_per_node})")


@dataclass(frozen=True)
class SimConfig:
    interval: float = 60.0  # seconds between scheduling rounds (Pollux §5.1)
    restart: float = 30.0  # seconds a job loses when its GPUs change (Pollux §5.1)
    horizon: float = 30 * 24 * 3600.0  # stop (and fail) past this simulated time
    gpu_quota: tuple[tuple[str, int], ...] = ()  # per user, GPUs at once


def simulate(
    specs: list[JobSpec],
    applications: dict[str, Application],
    policy: Policy,
    cluster: Cluster,
    config: SimConfig = SimConfig(),
    fleet: Fleet | None = None,
) -> SimResult:
    """Run ``specs`` under ``policy`` until every job is done."""
    fleet = fleet or FixedFleet(cluster)
    cluster = fleet.cluster  # an autoscaled fleet may hold more nodes than it starts with
    jobs = {s.name: _Job(s, applications[s.application]) for s in specs}
    pending = sorted(jobs.values(), key=lambda j: j.spec.submit_time)
    active: list[_Job] = []
    done: list[_Job] = []
    interval = config.interval
    now = math.floor(pending[0].spec.submit_time / interval) * interval
    oracle = getattr(policy, "needs_oracle", False)
    timeline: list[tuple[float, dict[str, int]]] = []
    gpu_seconds = 0.0
    quota = dict(config.gpu_quota) or None
    pool = _Pool()
    while pending or active:
        skip_to = admit_arrivals(pending, active, now, interval, config.horizon,
                                 hint=": check that each job fits the cluster")
        if skip_to is not None:
            now = skip_to
            continue
        def views(now=now, active=active):
            return [j.view(now, cluster.total_gpus, cluster.gpus_per_node, oracle, pool)
                    for j in active]

        seen = views()
        available = fleet.available_nodes(now, seen)
        lost = [j for j in active if j.allocation
                and any(n not in available for n, _ in j.allocation.nodes)]
        for job in lost:  # preempted (or scaled-in) nodes take their jobs' GPUs away
            job.allocation = None
            job.preemptions += 1
        state = RoundState(
            now=now,
            cluster=cluster,
            jobs=views() if lost else seen,
            available_nodes=tuple(available),
            restart_seconds=config.restart,
            interval=interval,
            gpu_quota=quota,
            gpu_price=fleet.gpu_price,
        )
        allocs = policy.allocate(state)
        by_name = {j.spec.name: j for j in active}
        _check(allocs, by_name, state)
        snapshot = {}
        for job in active:
            new = allocs.get(job.spec.name)
            old = job.allocation
            if new is not None and (old is None or old.nodes != new.nodes):
                job.restart_left = config.restart
                job.restarts += job.start is not None
                job.start = now if job.start is None else job.start
            job.allocation = new
            if new is not None:
                job.max_seen = max(job.max_seen, new.replicas)
                snapshot[job.spec.name] = new.replicas
                gpu_seconds += new.replicas * interval
            job.advance(now, interval, pool)
        timeline.append((now, snapshot))
        fleet.account(now, interval)
        now += interval
        still = []
        for job in active:
            if job.finish is not None:
                gpu_seconds -= job.allocation.replicas * (now - job.finish)
                job.allocation = None
                done.append(job)
            else:
                still.append(job)
        active = still
    return SimResult(
        policy=policy.name,
        jobs=job_results(done),
        gpu_seconds=gpu_seconds,
        timeline=tuple(timeline),
        cost=fleet.cost,
        node_seconds=fleet.node_seconds,
        gpus_per_node=cluster.gpus_per_node,
    )
