"""The controller on the driver: starts the workers, follows their progress, survives
failures; lose, gain and give back workers while the job trains.

One *formation* is a set of live :class:`ElasticWorker` processes joined in one
process group under one plan. The controller follows its step reports. A worker process
that dies (killed, out of memory, node lost) is reported by Ray as soon as its process
is gone, so the controller notices within the poll interval, not after a collective
timeout. What it does then is its :class:`~unipar.runtime.elastic.recovery.Recovery`
policy: ``RESTART_FROM_CHECKPOINT`` (``elastic=False``) takes the whole gang, topped up
to its fixed size, back to the newest disk checkpoint, up to ``max_failures`` times;
``LIVE`` (the default) recovers from memory and follows the cluster:

- **loss** (a process killed, a node removed): Ray reports the dead actor within the
  poll interval; the survivors' step fails in its collective (a rank whose step fails
  cuts its gloo connections, :mod:`~unipar.runtime.elastic.gloo_links`, so none waits on
  it), they drop it and end their stream with the step they committed. The state comes
  from memory: under a replicated plan (data parallel) from the survivor with the most
  committed steps (a survivor cannot be behind: a step is committed only after its gradient
  all-reduce completed everywhere; alone in the new gang they keep their model as it is),
  under a sharded plan from the newest in-memory snapshot (taken as often as 2% of the
  training time allows, or every ``snapshot_every`` steps; the steps since are redone,
  on the same samples, so with the same losses);
- **grow**: when the free resources of the cluster hold another worker, new workers
  start (import torch, build the dataset) while the formation trains; once they are
  up, the gang stops at the next step boundary, snapshots its state to memory and
  re-forms with them: no step lost;
- **drain**: a node that Ray is draining (preemption notice, autoscaler scale-down)
  has its workers leave the same way, at a step boundary: no step lost;
- **size target** (:mod:`unipar.runtime.elastic.size_target`): an outside decision (the shared
  cluster's scheduler) bounds the gang: workers past it leave as from a draining node,
  and the gang grows only up to it;
- **move**: when the size target names other resources for each worker (another node
  type), workers that hold them start while the gang trains on, and the gang re-forms on
  them at a step boundary, the old ones leaving as from a draining node
  (:mod:`unipar.runtime.elastic.placement`).

After each event the plan is derived again for the new size (the planner, for a
strategy; :func:`resize_plan` for a given plan), a fresh rendezvous is handed out
and the workers (survivors keep their processes) rebuild the model on the meta device
and load the state with DCP's resharding from bytes held in Ray's object store.
Progress is counted in optimizer steps of a fixed global batch, so the data order,
the LR schedule and the checkpoint steps do not depend on the number of workers.
Disk checkpoints remain the last resort (a sharded plan without a snapshot).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import ray

from unipar.errors import ResourceError, TrainingFailedError, UniparError, UserCodeError
from unipar.job import Job
from unipar.plan import Plan
from unipar.ray_cluster.session import say_waiting
from unipar.ray_cluster.supervisor import (
    PROCESS_LOST,
    Member,
    Stream,
    Supervisor,
    on_draining_nodes,
)
from unipar.runtime.callbacks import Callback, WorkerInfo, WorkerLost
from unipar.runtime.config import RunConfig
from unipar.runtime.elastic.formation import (
    GRACE_S,
    SURVIVOR_GRACE_S,
    FormationEnd,
    FormBroken,
    ResizeEvent,
    StateSource,
    event_record,
    gather_forms,
)
from unipar.runtime.elastic.gang_workers import worker_actor, worker_needs
from unipar.runtime.elastic.placement import WorkerPlacement
from unipar.runtime.elastic.recovery import Recovery
from unipar.runtime.elastic.rendezvous import RendezvousHost
from unipar.runtime.elastic.size_target import SizeTarget, bounded
from unipar.runtime.elastic.snapshot import SnapshotAssembly, SnapshotPart
from unipar.runtime.elastic.state_keeper import StateKeeper
from unipar.runtime.elastic.worker import (
    Finished,
    Interrupted,
    is_stream_end,
    replicated,
)
from unipar.runtime.metrics import MetricsWriter, StepAggregator, StepMetrics
from unipar.runtime.progress import ProgressBar
from unipar.runtime.step_records import CheckpointPolicy, StepReport, TrainOutcome
from unipar.runtime.tracing import TraceBatch, TraceRecord, steps_traced

_CLUSTER_CHECK_S = 1.0  # how often the cluster is asked for free room and draining nodes
# (and at every poll while the size target has moved or joiners start up)
_JOINER_WAIT_S = 30.0  # workers started to grow still not placed by then are given up
_STOPPING_POLL_S = 0.02  # how often the streams are read while the gang pauses to resize
_NOTICE_AFTER_S = 1.0  # room still short by then at the start is held by other jobs: say so


@dataclass
class RunState:
    attempt: int = 0  # the formation training now (0: the first); a restart's attempt
    failures: int = 0
    history: dict[int, StepMetrics] = field(default_factory=dict)
    # The traced steps' records of the gang that ran them (``trace_steps``), all ranks.
    trace: list[TraceRecord] = field(default_factory=list)


class Controller:
    def __init__(
        self,
        job: Job,
        config: RunConfig,
        *,
        plan_for: Callable[[int], Plan],
        resume_from: Path | None,
        metrics: MetricsWriter,
        callbacks: Sequence[Callback] = (),
        size_target: Callable[[], int | None] | None = None,
        predict: Callable[[Plan], float | None] | None = None,
        early: Sequence[Any] = (),
    ) -> None:
        """``predict``: the cost model's step time of each formation's plan, which its
        steps' metrics carry (``None``: not predicted). ``early``: workers started before
        the job was loaded (:mod:`~unipar.runtime.elastic.early_start`), used first;
        those the gang does not take are killed once it has started."""
        self.job, self.config, self.plan_for = job, config, plan_for
        self.recovery = Recovery.of(config)
        self.predict = predict
        self.size_target = size_target
        self.metrics, self.callbacks = metrics, callbacks
        self.policy = CheckpointPolicy(
            directory=config.checkpoints.resolve(),
            every=config.checkpoint_interval(job.steps),
            keep=config.keep_checkpoints,
        )
        self.state = RunState()
        self.resizes: list[ResizeEvent] = []
        self.bar = ProgressBar(job.steps, enabled=config.progress)
        self.host = RendezvousHost()
        self.workers: list[WorkerInfo] = []
        self.plan: Plan | None = None
        self.states = StateKeeper(self.policy.directory, resume_from)
        self._joiners: list[Member] = []  # started workers the present gang may grow by
        self._started_joiners_at = 0.0  # when the last workers to grow by were started
        self._last_lost: WorkerLost | None = None
        self._sent_batch: int | None = None  # the batch set from outside this gang was sent
        # the resources each new worker asks for besides its CPUs and GPUs (a node type's)
        self.placement = WorkerPlacement(self._wanted_resources, worker_needs(config),
                                         _JOINER_WAIT_S)
        self.supervisor = Supervisor(self._make_actor, self.placement.needs)
        self._early = list(early)
        self._job_bytes: bytes | None = None  # the job pickled once for the early workers
        if self.placement.placed:  # they hold none of a node type's resources
            self._kill_early()

    def _make_actor(self) -> Any:
        """A new worker: one started early, handed the job, while there is one and the
        workers need no node type's resources; else a fresh one."""
        if self._early and not self.placement.placed:
            if self._job_bytes is None:
                self._job_bytes = ray.cloudpickle.dumps(self.job)
            actor = self._early.pop(0)
            actor.adopt.remote(self._job_bytes, self.policy)
            return actor
        return worker_actor(self.config, self.placement.placed, self.job, self.policy)

    # -- the run ---------------------------------------------------------------------

    def run(self) -> TrainOutcome:
        config = self.config
        members: list[Member] = []
        try:
            # a size target set (a scheduler's) promises its room, which a job about to
            # end may still hold: start that many; without one, start what fits now
            most = self._most()
            promised = self.size_target is not None and self.size_target() is not None
            room = self._room() if promised else self._room_for_least()
            wanted = most if promised else max(config.least_workers, min(most, room))
            if config.progress:
                self.bar.note(f"unipar: starting {wanted} worker{'s' * (wanted != 1)}")
            members = self.placement.start(self.supervisor, wanted, config.placement_timeout_s,
                                           self._most)
            self._kill_early()
            members = self._at_least_min(members)
            keep = self._usable(min(len(members), self._most()))  # the target may have fallen
            self.supervisor.kill(members[keep:])
            members = members[:keep]
            source = self.states.first()
            while True:
                try:
                    end = self._formation(members, source)
                except FormBroken as broken:
                    if self.recovery.keeps_state_in_memory:
                        members, source = self._reform_broken(members, source, broken)
                    else:
                        members, source = self._restart(broken.survivors)
                    continue
                finished = [s.result for s in end.streams if isinstance(s.result, Finished)]
                if finished:  # past the final barrier: every rank finished
                    self.supervisor.kill(end.joiners)
                    return finished[0].outcome
                members, source = self._reform(members, end)
        finally:
            self._kill_early()
            self.supervisor.cancel_pending()
            self.supervisor.kill(members + self._joiners)
            self.host.close()
            self.bar.close()

    def _room(self) -> int:
        """Room for workers: the cluster's free room, and at least the early workers'
        own. (Until Ray has placed them and its free resources say so, the room they will
        hold still counts as free, so theirs is not added on top: never counted twice; at
        worst an elastic gang starts smaller and grows.)"""
        return max(len(self._early), self.supervisor.room())

    def _kill_early(self) -> None:
        """Kill the early workers not handed the job."""
        for actor in self._early:
            ray.kill(actor, no_restart=True)
        self._early = []

    def _room_for_least(self) -> int:
        """The cluster's room for workers, once it holds ``min_workers`` or after
        ``_NOTICE_AFTER_S`` (a gang just stopped frees its resources within it); still
        short then, other jobs hold them: say that the start waits for them."""
        least, until = self.config.least_workers, time.monotonic() + _NOTICE_AFTER_S
        while (room := self._room()) < least and time.monotonic() < until:
            time.sleep(0.1)
        if room < least:
            say_waiting(worker_needs(self.config), least - len(self._early), "worker",
                        self.config.placement_timeout_s)
        return room

    def _at_least_min(self, members: list[Member]) -> list[Member]:
        """``members``, topped up to ``min_workers`` with new ones (waiting for room)."""
        config = self.config
        missing = config.least_workers - len(members)
        if missing > 0:
            members = members + self.placement.start(self.supervisor, missing,
                                                      config.placement_timeout_s, lambda: missing)
        if len(members) < config.least_workers:
            self.supervisor.kill(members)
            if self.supervisor.raised:
                raise UserCodeError(
                    f"only {len(members)} of min_workers={config.least_workers} workers "
                    f"started: a worker's constructor raised {self.supervisor.raised[0]}. "
                    "The job (its model, dataset and loss) is unpickled in every worker "
                    "process: define them in the job file or in a module the workers can "
                    "import (installed, or shipped with Ray's runtime_env py_modules)"
                )
            raise ResourceError(
                f"only {len(members)} workers could be started within "
                f"{config.placement_timeout_s:g} s, fewer than min_workers="
                f"{config.least_workers}; free resources now: {ray.available_resources()}; "
                "lower the minimum or free resources"
            )
        return members

    def _formation(self, members: list[Member], source: StateSource) -> FormationEnd:
        config = self.config
        size = len(members)
        plan = self.plan = self.plan_for(size)
        rendezvous = self.host.new(size, config.collective_timeout_s)
        self.state.attempt = rendezvous.generation - 1
        self.workers = [
            WorkerInfo(rank, m.pid, m.node_ip, m.node_id, m.resources)
            for rank, m in enumerate(members)
        ]
        forms = [
            member.actor.form.remote(
                rendezvous,
                plan,
                rank,
                start_step=source.step,
                snapshot=source.snapshot,
                resume_from=source.resume_from,
                timeout_s=config.collective_timeout_s,
                keep=member.pid in source.keep,
            )
            for rank, member in enumerate(members)
        ]
        start = self._wait_formed(forms, members)
        self._assembly = SnapshotAssembly(size)  # parts of this gang only
        predicted = self.predict(plan) if self.predict is not None else None
        self.aggregator = StepAggregator(size, predicted)
        self.bar.start_at(start)
        every = self._snapshot_every(plan)
        self.state.trace.clear()  # only the gang that ran the traced steps sends records
        traced = steps_traced(config.trace_steps, self.job)
        self._sent_batch = None
        self._send_batch()  # a batch set from outside holds in every formation
        streams = [Stream(m, m.actor.train.remote(every, traced)) for m in members]
        return self._follow(streams, members)

    def _snapshot_every(self, plan: Plan) -> int | None:
        """Replicated state needs no snapshot (any survivor has it all); sharded state is
        snapshotted as often as 2% of the training time allows, unless set. A restart
        takes no state from memory: no snapshot."""
        if not self.recovery.keeps_state_in_memory:
            return 0
        if self.config.snapshot_every is not None:
            return self.config.snapshot_every
        return 0 if replicated(plan) else None

    def _wait_formed(self, forms: list[ray.ObjectRef], members: list[Member]) -> int:
        """The first step of the formed gang. A member lost meanwhile counts as a failure
        (``max_failures``) and breaks the formation (:class:`FormBroken`): the store
        is closed, so that the others, waiting for it, return; they are given up after
        a grace period."""
        lost, failed = gather_forms(forms, self.config.collective_timeout_s)
        if lost:
            self.host.close()
            for rank, error in lost.items():
                self._lost(rank, error)
            ray.wait(forms, num_returns=len(forms), timeout=GRACE_S)
            gone = [m for rank, (m, ref) in enumerate(zip(members, forms, strict=True))
                    if rank in lost or not ray.wait([ref], timeout=0)[0]]
            self.supervisor.kill(gone)
            raise FormBroken([m for m in members if m not in gone])
        if failed is not None:
            self.supervisor.kill(members)
            cause = failed.cause if isinstance(failed.cause, BaseException) else failed
            if isinstance(cause, UniparError):
                raise cause from None
            raise UserCodeError(f"a worker failed to form the gang:\n{failed}") from None
        if len(ray.wait(forms, num_returns=len(forms), timeout=0)[0]) < len(forms):
            self.supervisor.kill(members)
            raise TrainingFailedError(
                f"the gang did not form within collective_timeout_s="
                f"{self.config.collective_timeout_s:g} s; check the workers' logs, or raise "
                "it"
            )
        return int(ray.get(forms[0]))

    def _follow(self, streams: list[Stream], members: list[Member]) -> FormationEnd:
        config = self.config
        dead: list[Member] = []
        leaving: list[Member] = []
        joiners: list[Member] = []
        self._joiners = joiners  # killed by run() if this raises
        reason, began, lost_at = "", 0.0, 0.0
        stop_requested = False
        interrupted_at: float | None = None
        next_check = time.monotonic() + _CLUSTER_CHECK_S
        most = self._most()  # a change of the size target is acted on at once
        while running := [s for s in streams if not s.done]:
            # once a stop is asked, the gang pauses within a step or two: watch closely
            interval = _STOPPING_POLL_S if stop_requested else config.poll_interval_s
            ray.wait([s.handle for s in running], num_returns=1, timeout=interval)
            reports: list[StepReport] = []
            for stream in running:
                try:
                    items = stream.take_ready(is_last=is_stream_end)
                except PROCESS_LOST as error:
                    stream.done = True
                    if not dead:  # one loss event per gang, even mid-pause for a resize
                        lost_at = time.monotonic()
                        if stream.member not in leaving:  # a drained node's worker: no
                            self._lost(members.index(stream.member), error)  # failure
                        if not reason:
                            reason = f"worker lost on node {stream.member.node_ip}"
                            began = lost_at
                    dead.append(stream.member)
                    continue
                for item in items:
                    if isinstance(item, StepReport):
                        reports.append(item)
                    elif isinstance(item, SnapshotPart):
                        if (whole := self._assembly.add(item)) is not None:
                            self.states.snapshot = (item.step, whole)
                    elif isinstance(item, TraceBatch):
                        self.state.trace.extend(item.records)
            self._record(reports)
            if not dead:
                self._send_batch()
            now = time.monotonic()
            if interrupted_at is None and any(isinstance(s.result, Interrupted) for s in streams):
                interrupted_at = now
            if not dead and interrupted_at is not None and now - interrupted_at > GRACE_S:
                # A step failed with no peer lost: the job's code raised on some rank and
                # the others wait in a collective; stop them (the error is raised next).
                self.supervisor.kill([s.member for s in streams if not s.done])
                break
            if dead and now - lost_at > SURVIVOR_GRACE_S:
                stuck = [s.member for s in streams if not s.done]
                self.supervisor.kill(stuck)
                dead += stuck
                for stream in streams:
                    stream.done = True
            # a moved size target, or joiners starting up, are looked at every poll
            # (not while the gang pauses: nothing is decided then)
            deciding = self.recovery.follows_cluster and not dead and not stop_requested
            target = self._most() if deciding else most
            moved = deciding and self.placement.changed()
            if deciding and (now >= next_check or target != most or self.supervisor.pending
                             or moved):
                next_check, most = now + _CLUSTER_CHECK_S, target
                self.placement.follow(self.supervisor, joiners)
                leaving = on_draining_nodes(members)
                excess = len(members) - most
                if leaving:
                    reason = f"node {leaving[0].node_ip} draining"
                elif excess > 0:
                    self.supervisor.cancel_pending()
                    leaving = members[-excess:]
                    reason = f"size target {most}"
                elif misplaced := self.placement.misplaced(members):
                    if self.placement.replaced(self.supervisor, len(members) - len(misplaced),
                                               joiners, most):
                        leaving, reason = misplaced, f"moved to {self.placement.describe()}"
                else:
                    joiners += self.supervisor.take_started()
                    reason = self._grow(len(members), joiners)
                if reason:
                    began, stop_requested = now, True
                    self.host.request_stop()
            if reports and running and not dead:
                time.sleep(max(0.0, interval - (time.monotonic() - now)))
        return FormationEnd(streams, dead, leaving, joiners, reason, began)

    def _grow(self, size: int, joiners: list[Member]) -> str:
        """Start workers in the background toward the largest size the plan takes within
        the room (a worker that makes no such size would hold its resources idle); once
        they are up, the reason to re-form with them (else ""). Joiners past a size
        target lowered meanwhile are stopped (a re-formation for them would only pause
        the gang); workers still not placed ``_JOINER_WAIT_S`` after they were started
        (the room went to other work meanwhile) are given up, so those up can join."""
        most = self._most()
        extra = size + len(joiners) + len(self.supervisor.pending) - most
        if extra > 0:
            self.supervisor.cancel_pending()
            extra = size + len(joiners) - most
            if extra > 0:
                self.supervisor.kill(joiners[-extra:])
                del joiners[-extra:]
        have = size + len(joiners)
        if have < most and not self.supervisor.pending:
            goal = self._usable(min(most, have + self.supervisor.room()))
            if goal > have:
                self.supervisor.start_in_background(goal - have)
                self._started_joiners_at = time.monotonic()
        if joiners and self._usable(have) > size:
            if not self.supervisor.pending:
                return "resources free"
            if time.monotonic() - self._started_joiners_at > _JOINER_WAIT_S:
                self.supervisor.cancel_pending()
                return "resources free"
        return ""

    def _send_batch(self) -> None:
        """An adaptive job's global batch set by the size target (a scheduler's), passed
        to the gang when it changes (:meth:`RendezvousHost.request_batch`)."""
        target = self.size_target
        batch = target.batch() if isinstance(target, SizeTarget) else None
        if batch is not None and batch != self._sent_batch and self.job.adaptive is not None:
            self.host.request_batch(batch)
            self._sent_batch = batch

    def _wanted_resources(self) -> dict[str, float]:
        """The resources the size target names for each worker (none without one)."""
        target = self.size_target
        return target.resources() if isinstance(target, SizeTarget) else {}

    def _lost(self, rank: int, error: BaseException) -> None:
        lost = self._last_lost = WorkerLost(rank, error)
        self.state.failures += 1
        for callback in self.callbacks:
            callback.on_failure(lost, self.state.attempt)
        if self.state.failures > self.config.max_failures:
            raise TrainingFailedError(
                f"workers failed {self.state.failures} times, more than max_failures="
                f"{self.config.max_failures}; last: {lost}. Check the workers' logs, or raise "
                "max_failures"
            ) from error

    # -- re-forming ------------------------------------------------------------------

    def _reform(self, members: list[Member], end: FormationEnd) -> tuple[list[Member], StateSource]:
        ends = [s.result for s in end.streams if s.member not in end.dead]
        # the cause first: the other ranks' failures are the cut connections it left
        failed = sorted((e for e in ends if isinstance(e, Interrupted)), key=lambda e: not e.first)
        if failed and not end.dead:
            self.supervisor.kill(members + end.joiners)
            error = failed[0].error
            if isinstance(error, UniparError):
                raise error
            raise UserCodeError(f"a worker raised:\n{failed[0].trace}") from None
        gone = end.dead + end.leaving
        # with no loss the state comes from the pause's snapshot: members leaving free
        # their room now, for the workers that may be started in it (a move with no room)
        self.supervisor.kill(end.dead if end.dead else end.leaving)
        survivors = [m for m in members if m not in gone]
        if end.dead and not self.recovery.keeps_state_in_memory:
            return self._restart(survivors)
        new = self._at_least_min(survivors + end.joiners)
        new = new[: self._usable(min(len(new), max(self._most(), len(survivors))))]
        assert self.plan is not None
        source = self.states.after(self.plan, self.plan_for, members, end, new)
        self.supervisor.kill(end.leaving + [m for m in survivors + end.joiners if m not in new])
        self.aggregator_flush(source.step)
        event = ResizeEvent(
            source.step, len(members), len(new), end.reason, time.monotonic() - end.began
        )
        self._note_resize(event)
        return new, source

    def _restart(self, survivors: list[Member]) -> tuple[list[Member], StateSource]:
        """``RESTART_FROM_CHECKPOINT`` after a loss: the gang, topped up to its size with new
        workers, goes back to the newest disk checkpoint, else to where the run began.
        The survivors' processes stay (torch and the dataset loaded), their state does not."""
        source = self.states.restart()
        resumed = self.states.resume_from
        where = f"checkpoint {resumed.name}" if resumed else "the start"
        self.bar.note(
            f"[unipar] {self._last_lost}; restarting from {where} "
            f"(failure {self.state.failures} of at most {self.config.max_failures})"
        )
        return self._at_least_min(survivors), source

    def _note_resize(self, event: ResizeEvent) -> None:
        self.resizes.append(event)
        self.metrics.write_event({"event": "resize", **event_record(event)})
        self.bar.note(f"[unipar] resize {event}")
        for callback in self.callbacks:
            callback.on_resize(event)

    def _reform_broken(
        self, members: list[Member], source: StateSource, broken: FormBroken
    ) -> tuple[list[Member], StateSource]:
        """The next gang after members were lost while one formed: the survivors (topped
        up to the minimum) from the same state (a formation trains no step). Survivors
        that kept their replica's state keep it, or one of them writes it out for all."""
        began = time.monotonic()
        new = self._at_least_min(broken.survivors)
        new = new[: self._usable(min(len(new), self._most()))]
        self.supervisor.kill([m for m in broken.survivors if m not in new])
        source = self.states.after_broken(source, new, self.plan_for)
        event = ResizeEvent(source.step, len(members), len(new),
                            "worker lost while the gang formed", time.monotonic() - began)
        self._note_resize(event)
        return new, source

    def _most(self) -> int:
        """The most workers now: the size target's, within the job's range."""
        target = self.size_target() if self.size_target is not None else None
        return bounded(target, self.config.least_workers, self.config.workers)

    def _usable(self, size: int) -> int:
        """The largest size up to ``size`` that the plan can be derived for."""
        for n in range(size, self.config.least_workers - 1, -1):
            try:
                self.plan_for(n)
                return n
            except UniparError:
                continue
        return size  # plan_for raises the reason when the gang forms

    # -- progress --------------------------------------------------------------------

    def aggregator_flush(self, below: int) -> None:
        """Record steps below ``below`` that some rank committed but whose reports are
        incomplete (a rank died after the step): their loss is the reporting ranks'."""
        self._record_metrics(self.aggregator.flush_below(below, self.state.attempt))

    def _record(self, reports: list[StepReport]) -> None:
        self._record_metrics(self.aggregator.add(reports, self.state.attempt))

    def _record_metrics(self, completed) -> None:  # type: ignore[no-untyped-def]
        for metrics in completed:
            self.state.history[metrics.step] = metrics
            self.metrics.write(metrics)
            self.bar.update(metrics)
            for callback in self.callbacks:
                callback.on_step(metrics, self.workers)
