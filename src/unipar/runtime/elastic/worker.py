"""The actor of the gang (elastic or not): one process that outlives the gangs it serves.

Torch, the job's dataset and DCP are imported once, when the actor starts; a resize, or
a restart from the disk (``elastic=False``), only re-forms the process group and
rebuilds the model for the new plan (``form``), so a survivor of a lost peer is training
again in well under a second (the state loaded from the disk aside).

``train`` streams, in order: step reports, in-memory snapshots (when due) and one
final item saying how the gang's run ended for this rank:

- :class:`Finished`: the job's last step is done;
- :class:`Paused`: the controller asked the gang to stop at a step boundary (to grow,
  or because a node is draining); the state at that step was snapshotted first;
- :class:`Interrupted`: a step failed (a peer's process died, or the job's code
  raised); that step is dropped (its gradients zeroed, no optimizer step), so this
  rank's state is the one after ``committed`` steps.
"""

from __future__ import annotations

import time
import traceback
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import ray
import torch

from unipar.errors import UserCodeError
from unipar.job import Job
from unipar.plan import Plan
from unipar.ray_cluster.supervisor import describe_process
from unipar.runtime.adaptive import adapt_state_of, with_adapt_state
from unipar.runtime.checkpoint import _dcp
from unipar.runtime.elastic.gloo_links import GlooLinks
from unipar.runtime.elastic.rendezvous import Rendezvous, StopSignal, join, leave
from unipar.runtime.elastic.snapshot import (
    SnapshotCadence,
    SnapshotPart,
    load_from_memory,
    save_to_memory,
)
from unipar.runtime.heap import settle_heap
from unipar.runtime.step_records import CheckpointPolicy, StepReport, TrainOutcome
from unipar.runtime.tracing import TraceBatch

if TYPE_CHECKING:  # loaded in the worker's process only: _trainer_class
    from unipar.runtime.trainer import Trainer


@dataclass(frozen=True)
class Finished:
    outcome: TrainOutcome


@dataclass(frozen=True)
class Paused:
    step: int


@dataclass(frozen=True)
class Interrupted:
    committed: int
    error: BaseException
    trace: str
    first: bool = True  # the gang's first rank to fail: its error is the cause


StreamEnd = Finished | Paused | Interrupted


def is_stream_end(item: object) -> bool:
    return isinstance(item, (Finished, Paused, Interrupted))


def replicated(plan: Plan) -> bool:
    """Every rank holds the whole state (plain data parallel, the optimizer state not
    shared out): any survivor has it all."""
    mesh = plan.mesh
    return mesh.fsdp == 1 and mesh.tp == 1 and mesh.pp == 1 and not plan.distributed_optimizer


def _trainer_class() -> type[Trainer]:
    """The Trainer, imported in the worker's process with what applying a plan needs
    (DTensor, FSDP, pipelining). The driver imports this module for the actor's class
    and never runs this: those imports were about 0.5 s of its start."""
    from unipar.runtime.trainer import Trainer  # noqa: PLC0415 (deferred, heavy: above)

    return Trainer


class ElasticWorker:
    def __init__(
        self,
        job: Job | None,
        *,
        threads: int,
        use_gpu: bool,
        checkpoints: CheckpointPolicy | None,
    ) -> None:
        """``job`` and ``checkpoints`` ``None``: a worker started before the driver has
        loaded the job (:mod:`~unipar.runtime.elastic.early_start`), which takes both
        with :meth:`adopt` before anything else."""
        torch.set_num_threads(threads)
        self.job, self.use_gpu, self.checkpoints = job, use_gpu, checkpoints
        self.device = torch.device("cuda", 0) if use_gpu else torch.device("cpu")
        self.trainer: Trainer | None = None
        self.signal: StopSignal | None = None
        self.committed = 0
        self.links = GlooLinks()
        self.adopt_error: str | None = None
        _dcp()  # imported now, while the gang trains, not during a resize
        _trainer_class()  # imported now, as the actor starts

    def adopt(self, job: bytes, checkpoints: CheckpointPolicy) -> None:
        """Take the job (pickled by the driver, so that a job this process cannot unpickle
        is told by :meth:`describe`, as a constructor's error would be) of a worker
        started early."""
        try:
            self.job = ray.cloudpickle.loads(job)
        except Exception as error:  # the job's code: told by describe
            self.adopt_error = f"{type(error).__name__}: {error}"
        self.checkpoints = checkpoints

    def describe(self) -> tuple[int, str, str, dict[str, float]]:
        """(process id, node IP, Ray node id, assigned resources) of this worker; raises
        :class:`UserCodeError` when the job given to :meth:`adopt` did not load."""
        if self.adopt_error is not None:
            raise UserCodeError(f"the job could not be loaded: {self.adopt_error}")
        return describe_process()

    def form(
        self,
        rendezvous: Rendezvous,
        plan: Plan,
        rank: int,
        *,
        start_step: int,
        snapshot: list[ray.ObjectRef] | None,
        resume_from: Path | None,
        timeout_s: float,
        keep: bool = False,
    ) -> int:
        """Join a new gang as ``rank`` under ``plan``; take the state from ``snapshot``
        (refs to the snapshot's parts, one per rank that wrote it), else ``resume_from`` (disk),
        else start afresh; ``keep``: this rank already holds the state at ``start_step``
        (a replica that survived), re-wrapped as it is. Returns the first step to run."""
        assert self.job is not None and self.checkpoints is not None  # given, or adopted
        leave()
        self.links = GlooLinks()  # this gang's connections, none of an earlier gang's
        self.signal = join(
            rendezvous, rank, backend="nccl" if self.use_gpu else "gloo", timeout_s=timeout_s,
            links=self.links,
        )
        previous = self.trainer
        dataset = previous.dataset if previous is not None else None
        if not keep:  # its state is never used again: freed before the next is built
            self.trainer = previous = None
        # A kept trainer is replaced only once the new one holds the state: if this
        # formation breaks (a peer lost meanwhile), this rank still holds its state as it
        # was, for the next formation to keep or export.
        trainer = _trainer_class()(
            self.job,
            plan,
            rank=rank,
            world_size=rendezvous.world_size,
            device=self.device,
            checkpoints=self.checkpoints,
            dataset=dataset,
        )
        if keep and previous is not None and self.committed == start_step:
            trainer.adopt(previous, start_step)
        else:
            parts: list[SnapshotPart] = ray.get(snapshot) if snapshot else []
            trainer.start_step = trainer.setup(
                None if snapshot else resume_from, adapt_state_of(parts) if parts else None
            )
            if snapshot:
                load_from_memory(
                    parts,
                    parts=trainer.model.parts,
                    optimizers=trainer.optimizers,
                    collective=rendezvous.world_size > 1,
                )
                trainer.start_step = start_step
        self.trainer, self.committed = trainer, trainer.start_step
        if rendezvous.world_size > 1 and not self.use_gpu:  # the mesh's gloo groups too
            self.links.record_again(self.signal.store, rank, rendezvous.world_size)
        settle_heap()
        return trainer.start_step

    def export_state(self) -> SnapshotPart:
        """This rank's whole state at its last committed step, written by it alone (a
        replicated plan's survivor, after its gang broke up)."""
        trainer = self._trainer()
        part = save_to_memory(
            self.committed,
            0,
            parts=trainer.model.parts,
            optimizers=trainer.optimizers,
            collective=False,
        )
        return with_adapt_state(part, trainer.adapt)

    def _trainer(self) -> Trainer:
        if self.trainer is None:
            raise RuntimeError("form() must run before training")
        return self.trainer

    def _snapshot(self, step: int) -> SnapshotPart:
        trainer = self._trainer()
        part = save_to_memory(
            step,
            trainer.rank,
            parts=trainer.model.parts,
            optimizers=trainer.optimizers,
            collective=torch.distributed.is_initialized(),
        )
        return with_adapt_state(part, trainer.adapt)

    def train(
        self, snapshot_every: int | None, trace_steps: int | None = None
    ) -> Iterator[StepReport | SnapshotPart | TraceBatch | StreamEnd]:
        """Train from the formed state (see module doc), with an in-memory snapshot
        every ``snapshot_every`` steps (0: none; None: as often as 2% of the training
        time allows, see :class:`SnapshotCadence`) and one before a pause; trace the
        last ``trace_steps`` steps (see :meth:`Trainer.trace`).

        Nothing is snapshotted at step 0: the state there is the model built from the
        job's seed, rebuilt identically by any gang (and DCP's ``get_state_dict`` would
        initialise the empty optimizer state with a zero-learning-rate step, which
        counts as a step for Adam's bias correction)."""
        trainer, signal = self._trainer(), self.signal
        assert signal is not None
        step = trainer.start_step
        trainer.trace(trace_steps)
        cadence = SnapshotCadence(snapshot_every, start=step)
        final: Path | None = None
        snapshotted = -1  # the step of this gang's last snapshot
        try:
            try:
                while not trainer.done(step):
                    if signal.stop_before(step):
                        if step > 0 and step != snapshotted:  # not twice at one step
                            yield self._snapshot(step)
                        yield Paused(step)
                        return
                    if trainer.adapt is not None and (
                            held := signal.batch_before(step)) is not None:
                        trainer.adapt.hold(held)  # a scheduler's, on every rank alike
                    try:
                        report = trainer.run_step(step)
                    except BaseException:
                        trainer.drop_step()
                        raise
                    step = self.committed = step + 1
                    cadence.add_step(report.seconds)
                    yield report
                    if (batch := trainer.take_trace(step)) is not None:
                        yield batch
                    if cadence.due(step) and not trainer.done(step):
                        began = time.perf_counter()
                        yield self._snapshot(step)
                        snapshotted = step
                        cadence.took(step, time.perf_counter() - began)
                    if trainer.done(step) or trainer.checkpoint_due(step):
                        final = trainer.save(step)
                if torch.distributed.is_initialized():
                    torch.distributed.barrier()
            except Exception as error:  # a peer lost, or the job's code: the controller decides
                first = signal.first_to_fail()  # before the cut, whose echoes come second
                self.links.cut()  # peers waiting on this rank fail now, not at the timeout
                yield Interrupted(self.committed, error, traceback.format_exc(), first)
                return
            yield Finished(TrainOutcome(last_step=step, final_checkpoint=final))
        finally:
            leave()
