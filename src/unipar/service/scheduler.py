"""The scheduler: a detached Ray actor on the head node that alone places and sizes jobs.

Every ``interval_s`` it reads each running job's runner (steps, workers, step times,
resizes), records them in the store (:mod:`unipar.service.state`), runs the policy
(:mod:`unipar.service.decide`) and sets each runner's size target: a shrinking job's
workers leave at a step boundary, a growing one's join when the room is free; a queued
job starts when the policy gives it workers. It is started with ``max_restarts=-1``: if its
process dies Ray starts it again, and the new one reads the store and adopts the runners
still alive (they are detached and named ``unipar-job-<store token>-<id>``).

On a cluster whose nodes declare node types (:mod:`unipar.service.node_types`), the
policy's typed form decides instead (:mod:`unipar.service.decide_typed`): each job gets a
type and a count, and a running job given another type is moved there by its runner's
size target, which then names that type's resource.
"""

from __future__ import annotations

import os
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import ray
import ray.cloudpickle
from ray.autoscaler.sdk import request_resources
from ray.exceptions import ActorAlreadyExistsError
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from unipar.errors import ConfigError
from unipar.ray_cluster.supervisor import PROCESS_LOST, constructor_error
from unipar.sched.policies import PolicyName, TypedPolicyName, make_policy, make_typed_policy
from unipar.sched.typed_cluster import TypedCluster
from unipar.service.decide import ResizeCost, decided_batches, targets, useful_workers
from unipar.service.decide_typed import Placement, typed_targets
from unipar.service.node_types import type_resource, typed_cluster
from unipar.service.state import JobRow, JobState, Store

NAMESPACE = "unipar"
SCHEDULER_NAME = "unipar-scheduler"
STATUS_TIMEOUT_S = 10.0
NEW_RUNNER_WAIT_S = 0.2  # how long a round waits for runners not heard from yet


class Scheduler:
    """The actor (see the module's docstring)."""

    def __init__(self, state_dir: str, policy: str, interval_s: float) -> None:
        self.state_dir = Path(state_dir)
        self.store = Store(self.state_dir / "unipar.sqlite")
        self.token = self.store.token()
        self.policy_name = PolicyName(policy)
        self.policy = make_policy(self.policy_name)
        # on a cluster of several node types, the policy's typed form (None: it has none,
        # and schedules the cluster as one pool)
        typed = {n.value for n in TypedPolicyName}
        self.typed_policy = (make_typed_policy(TypedPolicyName(policy)) if policy in typed
                             else None)
        self.interval_s = interval_s
        self.runners: dict[int, Any] = {}
        self._polled: dict[int, float] = {}  # when each job's runner last answered
        self._costs: dict[int, tuple[list[float], list[float]]] = {}  # resize costs per job
        # workers asked of Ray's autoscaler (0: none; None: not known, as in a scheduler
        # that took over from a lost one, or a new one on a cluster an earlier service
        # used: a request stands until replaced, so the first round always sends one)
        self.requested: int | None = None
        self._lock = threading.RLock()  # the store and the runners, held briefly
        self._rounds = threading.Lock()  # one round at a time
        self._stop = threading.Event()
        self._wake = threading.Event()  # a round now: a job was submitted
        self._adopt()
        self._thread = threading.Thread(target=self._loop, daemon=True, name="unipar-rounds")
        self._thread.start()

    # -- calls from clients ---------------------------------------------------------------

    def ping(self) -> dict[str, Any]:
        return {"pid": os.getpid(), "policy": self.policy_name.value,
                "interval_s": self.interval_s, "state_dir": str(self.state_dir),
                "requested": self.requested or 0}

    def submit(self, row: JobRow, job: bytes) -> int:
        with self._lock:
            job_id = self.store.add(row, job)
            self.store.update(job_id, run_dir=str(self.state_dir / "runs" / str(job_id)),
                              runner=f"unipar-job-{self.token}-{job_id}")
            self.store.event(job_id, f"submitted by {row.user or '-'}: {row.name}, workers "
                             f"{row.least}:{row.most}, priority {row.priority}")
        self._wake.set()
        return job_id

    def jobs(self) -> list[JobRow]:
        return self.store.rows()

    def events(self, job_id: int) -> list[tuple[float, str]]:
        self._known(job_id)
        return self.store.events(job_id)

    def logs(self, job_id: int) -> str:
        row = self._known(job_id)
        lines = [f"{time.strftime('%H:%M:%S', time.localtime(t))} [scheduler] {text}"
                 for t, text in self.store.events(job_id)]
        log = self._log_path(row.id)
        return "\n".join(lines) + ("\n" + log.read_text() if log.exists() else "")

    def cancel(self, job_id: int) -> JobRow:
        with self._lock:
            row = self._known(job_id)
            if row.state.ended:
                raise ConfigError(
                    f"job {job_id} has already ended ({row.state.value}); nothing to cancel "
                    "(`unipar jobs` shows which jobs are queued or running)"
                )
            self._end(row, JobState.CANCELLED, "cancelled")
            return self._known(job_id)

    def shutdown(self) -> None:
        """Stop the rounds and every running job (``unipar down``)."""
        self._stop.set()
        self._wake.set()
        self._thread.join(timeout=2 * self.interval_s + STATUS_TIMEOUT_S)
        with self._lock:
            for row in self.store.rows(JobState.QUEUED, JobState.RUNNING):
                self._end(row, JobState.CANCELLED, "the service was stopped (unipar down)")
            self._ask_autoscaler(0)
            self.store.close()

    def round_now(self) -> None:
        """One round at once (else every ``interval_s``, or at once after a submission)."""
        self._round()

    # -- rounds ---------------------------------------------------------------------------

    def _loop(self) -> None:
        while not self._stop.is_set():
            self._wake.wait(self.interval_s)
            self._wake.clear()
            if self._stop.is_set():
                return
            try:
                self._round()
            except Exception as error:  # a round that fails is retried at the next one
                print(f"unipar scheduler: round failed: {type(error).__name__}: {error}",
                      flush=True)

    def _adopt(self) -> None:
        for row in self.store.rows(JobState.RUNNING):
            try:
                self.runners[row.id] = ray.get_actor(row.runner, namespace=NAMESPACE)
                self.store.event(row.id, "adopted by a restarted scheduler")
            except ValueError:
                self.store.update(row.id, state=JobState.FAILED, ended=time.time(),
                                  error="its runner was lost while the scheduler was down")
                self.store.event(row.id, "failed: runner lost while the scheduler was down")

    def _round(self) -> None:
        """Read the runners (all at once, without holding the store: clients are answered
        meanwhile), then decide and apply under the lock."""
        with self._rounds:
            with self._lock:
                running = self.store.rows(JobState.RUNNING)
            statuses = self._statuses(running)
            slots = cluster_slots()
            types = typed_cluster(ray.nodes())
            with self._lock:
                if self._stop.is_set():
                    return
                self._decide(statuses, slots, types)

    def _decide(self, statuses: dict[int, Any], slots: int,
                types: TypedCluster | None = None) -> None:
        now = time.time()
        for row in self.store.rows(JobState.RUNNING):
            if row.id in statuses:
                self._apply(row, statuses[row.id])
        rows = self.store.rows(JobState.QUEUED, JobState.RUNNING)
        cost = self.resize_cost()
        if types is not None and self.typed_policy is not None:
            decided = typed_targets(self.typed_policy, rows, types, now, self.interval_s, cost)
        else:
            decided = {job_id: Placement("", count) for job_id, count in
                       targets(self.policy, rows, slots, now, self.interval_s, cost).items()}
        # an adaptive job's batch with its size (Pollux: the policy sets both)
        batches = decided_batches(rows, {i: p.workers for i, p in decided.items()}, now, slots)
        for row in rows:
            place = decided.get(row.id, Placement("", 0))
            count = place.workers
            batch = batches.get(row.id, row.decided_batch)
            if row.state is JobState.QUEUED and count > 0:
                try:
                    self._start(row, place)
                except Exception as error:  # this job only: the round goes on
                    self._end(row, JobState.FAILED, f"failed to start: {error}",
                              error=f"{type(error).__name__}: {error}")
            elif row.state is JobState.RUNNING and count > 0 and (
                    count != row.target or place.gpu_type != row.gpu_type
                    or batch != row.decided_batch):
                held = {"batch": batch} if batch else {}  # an adaptive job's, once decided
                self.runners[row.id].set_target.remote(count, now,
                                                       type_resource(place.gpu_type), **held)
                self.store.update(row.id, target=count, gpu_type=place.gpu_type,
                                  decided_batch=batch)
                if batch != row.decided_batch:
                    self.store.event(row.id, f"batch {row.decided_batch or row.running_batch}"
                                     f" -> {batch} on {count} workers (goodput)")
                if count != row.target:
                    self.store.event(row.id, f"size {row.target} -> {count}")
                if place.gpu_type != row.gpu_type:
                    self.store.event(row.id, f"node type {row.gpu_type} -> {place.gpu_type}")
        # room for the useful workers where the cluster lacks it; withdrawn once it does not
        # (the autoscaler then may scale down); after the sizes, which never wait on it
        useful = useful_workers(rows, now, sum(r.most for r in rows))
        self._ask_autoscaler(useful if useful > slots else 0)

    def resize_cost(self) -> ResizeCost:
        """What a grow costs on this cluster, from the resizes the runners measured."""
        latencies = [x for grows, _ in self._costs.values() for x in grows]
        pauses = [x for _, pauses in self._costs.values() for x in pauses]
        return ResizeCost.measured(latencies, pauses)

    def _ask_autoscaler(self, workers: int) -> None:
        """Room for ``workers`` one-CPU workers (0: withdraw), sent when it changes or is
        not known (a request stands until the next one replaces it)."""
        if workers != self.requested:
            try:
                request_resources(bundles=[{"CPU": 1.0}] * workers)
            except Exception as error:  # asked again next round; jobs are sized meanwhile
                print(f"unipar scheduler: autoscaler request failed: {error}", flush=True)
                return
            self.requested = workers

    def _statuses(self, rows: list[JobRow]) -> dict[int, Any]:
        """Each runner's status, asked of all at once; a runner that does not answer within
        a round's interval is asked again next round (one not heard from yet, its process
        still starting, is waited for ``NEW_RUNNER_WAIT_S`` only: the round, and the
        sizes of the jobs that run, do not wait on it), one whose process is gone maps to
        :class:`RunnerLost` (why, when Ray says)."""
        asked: dict[int, Any] = {}
        out: dict[int, Any] = {}
        for row in rows:
            try:
                with self._lock:
                    runner = (self.runners.get(row.id)
                              or ray.get_actor(row.runner, namespace=NAMESPACE))
                    self.runners.setdefault(row.id, runner)
                asked[row.id] = runner.status.remote()
            except ValueError:
                out[row.id] = RunnerLost("its runner process was lost")
        if asked:  # a runner not heard from yet (its process starting) is not waited for
            ray.wait(list(asked.values()), num_returns=len(asked), timeout=NEW_RUNNER_WAIT_S)
            known = [ref for job_id, ref in asked.items() if job_id in self._polled]
            if known:
                ray.wait(known, num_returns=len(known),
                         timeout=min(STATUS_TIMEOUT_S, max(self.interval_s, 0.5)))
        for job_id, ref in asked.items():
            if not ray.wait([ref], timeout=0)[0]:
                continue
            try:
                out[job_id] = ray.get(ref)
            except PROCESS_LOST as error:
                out[job_id] = RunnerLost.of(error)
        return out

    def _apply(self, row: JobRow, status: Any) -> None:
        """Record a runner's status, or that it is lost."""
        if isinstance(status, RunnerLost):
            self._end(row, JobState.FAILED, f"failed: {status.reason}", error=status.reason)
            return
        now = time.time()
        last = self._polled.get(row.id, now - self.interval_s)
        self._polled[row.id] = now
        self._costs[row.id] = (status.grow_latency_s, status.pause_s)
        for text in status.resizes[row.restarts:]:
            self.store.event(row.id, f"resize {text}")
        if status.placements and status.gpu_type != row.held_type:
            self.store.event(row.id, f"workers hold node type {status.gpu_type} from step "
                             f"{status.placements[-1][0]}")
        self.store.update(
            row.id, grad_sqr=status.grad_sqr, grad_var=status.grad_var,
            batch_times=status.batch_times or None,
            step=status.step, workers=status.workers, step_times=status.step_times,
            steps_per_s=status.steps_per_s, running_batch=status.batch,
            typed_step_times=status.typed_step_times or None, held_type=status.gpu_type,
            restarts=len(status.resizes),
            max_seen=max(row.max_seen, status.workers),
            worker_seconds=row.worker_seconds + status.workers * (now - last),
        )
        if status.state == "done":
            self._end(row, JobState.DONE, "done")
        elif status.state == "failed":
            self._end(row, JobState.FAILED, f"failed: {status.error}", error=status.error)

    def _start(self, row: JobRow, place: Placement) -> None:
        # the runner trains (torch); the scheduler, and the client that reads it, do not
        from unipar.service.runner import JobRunner  # noqa: PLC0415 (heavy: torch)

        log = self._log_path(row.id)
        log.parent.mkdir(parents=True, exist_ok=True)
        job, options = _load(self.store.job(row.id))
        try:
            runner = (
                ray.remote(JobRunner)
                .options(name=row.runner, namespace=NAMESPACE, lifetime="detached",
                         num_cpus=0, max_concurrency=4, scheduling_strategy=here())
                .remote(row.id, job, options, row.run_dir, str(log), place.workers, time.time(),
                        # the job's whole range, not what the cluster holds now: nodes
                        # the autoscaler adds later are grown into (the target bounds it)
                        (row.sizes[0], row.sizes[-1]), type_resource(place.gpu_type))
            )
        except ActorAlreadyExistsError:  # made by a scheduler that died before recording it
            runner = ray.get_actor(row.runner, namespace=NAMESPACE)
            self.store.event(row.id, "adopted the runner a lost scheduler had started")
        self.runners[row.id] = runner
        self.store.update(row.id, state=JobState.RUNNING, started=time.time(),
                          target=place.workers, gpu_type=place.gpu_type)
        where = f" of node type {place.gpu_type}" if place.gpu_type else ""
        self.store.event(row.id, f"started on {place.workers} workers{where}")

    def _end(self, row: JobRow, state: JobState, text: str, **changes: Any) -> None:
        runner = self.runners.pop(row.id, None)
        if runner is not None:
            ray.kill(runner, no_restart=True)  # its training workers go with it
        self.store.update(row.id, state=state, ended=time.time(), target=0, **changes)
        self.store.event(row.id, text)

    def _known(self, job_id: int) -> JobRow:
        row = self.store.row(job_id)
        if row is None:
            ids = [r.id for r in self.store.rows()]
            known = f"{min(ids)}..{max(ids)}" if ids else "none yet"
            raise ConfigError(
                f"there is no job {job_id} on this cluster (job ids: {known}); `unipar jobs` "
                "lists them"
            )
        return row

    def _log_path(self, job_id: int) -> Path:
        return self.state_dir / "logs" / f"{job_id}.log"


@dataclass(frozen=True)
class RunnerLost:
    """A job's runner that no longer answers, and why."""

    reason: str

    @classmethod
    def of(cls, error: BaseException) -> RunnerLost:
        """From Ray's error: a constructor that raised (the job could not be unpickled,
        say) gives its exception's last line; else the process was lost."""
        last = constructor_error(error)
        if last is not None:
            return cls(f"its runner could not start: {last}")
        return cls("its runner process was lost")


def _load(blob: bytes) -> tuple[bytes, dict[str, Any]]:
    """The pickled job (left pickled: the scheduler never imports torch) and its ``fit``
    options, as :func:`unipar.service.client.submit` stored them."""
    return ray.cloudpickle.loads(blob)


def cluster_slots(cpus_per_worker: float = 1.0) -> int:
    """Workers of ``cpus_per_worker`` CPUs the live nodes hold in all."""
    return sum(
        int(node["Resources"].get("CPU", 0.0) // cpus_per_worker)
        for node in ray.nodes()
        if node["Alive"]
    )


def here() -> NodeAffinitySchedulingStrategy:
    """On this process's node (the head: the store and the logs are there)."""
    return NodeAffinitySchedulingStrategy(ray.get_runtime_context().get_node_id(), soft=False)


def head() -> NodeAffinitySchedulingStrategy:
    """On the cluster's head node."""
    node = next(n for n in ray.nodes()
                if n["Alive"] and "node:__internal_head__" in n["Resources"])
    return NodeAffinitySchedulingStrategy(node["NodeID"], soft=False)
