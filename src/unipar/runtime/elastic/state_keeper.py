"""Where the next formation of the elastic gang takes its state from, decided by the
controller after each event (:mod:`unipar.runtime.elastic.controller`):

- after a pause (a grow, a drain, a size target, a move): the snapshot the gang took at
  the step it paused at, else the disk (a pause before the first step);
- after a loss, under a replicated plan: the survivors with the most committed steps,
  which keep their state where the new gang is only them under a replicated plan, or
  one of which writes it to memory for all; under a sharded plan (or before any step):
  the newer of the in-memory snapshot and the disk checkpoint;
- after a loss while the gang formed: the same state as the broken formation's;
- under ``RESTART_FROM_CHECKPOINT``: the newest disk checkpoint, else where the run began.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import ray

from unipar.plan import Plan
from unipar.ray_cluster.supervisor import Member
from unipar.runtime.checkpoint import latest_checkpoint
from unipar.runtime.elastic.formation import (
    FormationEnd,
    StateSource,
    committed_steps,
    disk_source,
    export_state,
)
from unipar.runtime.elastic.snapshot import SnapshotPart
from unipar.runtime.elastic.worker import Paused, replicated


class StateKeeper:
    """The run's state sources: the newest whole in-memory snapshot (``snapshot``: its
    step and parts, set by the controller as the parts arrive), the disk checkpoints in
    ``directory``, and the checkpoint the run resumed from (``resume_from``)."""

    def __init__(self, directory: Path, resume_from: Path | None) -> None:
        self.directory = directory
        self.resume_from = resume_from
        self.snapshot: tuple[int, list[SnapshotPart]] | None = None

    def first(self) -> StateSource:
        """The first formation's: the checkpoint resumed from, or the start."""
        return StateSource(step=0, resume_from=self.resume_from)

    def restart(self) -> StateSource:
        """``RESTART_FROM_CHECKPOINT``'s: the newest disk checkpoint, else the one the run
        resumed from, else the start; it becomes the one resumed from."""
        self.resume_from = latest_checkpoint(self.directory) or self.resume_from
        return disk_source(self.resume_from)

    def after(
        self,
        plan: Plan,
        plan_for: Callable[[int], Plan],
        members: list[Member],
        end: FormationEnd,
        new: list[Member],
    ) -> StateSource:
        """The state of ``new`` after the formation of ``members`` under ``plan`` ended as
        ``end`` (module doc)."""
        ends = {s.member.pid: s.result for s in end.streams}
        if not end.dead:
            step = next(e.step for e in ends.values() if isinstance(e, Paused))
            if self.snapshot is not None and self.snapshot[0] == step:
                return self.from_snapshot()
            return disk_source(self.resume_from)  # paused before the first step
        survivors = [m for m in members if m not in end.dead]
        committed = {m.pid: committed_steps(ends.get(m.pid)) for m in survivors}
        if replicated(plan) and max(committed.values(), default=0) > 0:
            top = max(committed.values())
            holders = [m for m in survivors if committed.get(m.pid) == top]
            if replicated(plan_for(len(new))) and all(m in holders for m in new):
                return StateSource(top, keep=frozenset(m.pid for m in new))
            return StateSource(top, snapshot=[export_state(holders, new)])
        return self.without_holders()

    def after_broken(
        self, source: StateSource, new: list[Member], plan_for: Callable[[int], Plan]
    ) -> StateSource:
        """The state of ``new`` after members were lost while a gang formed from
        ``source`` (a formation trains no step): survivors that kept their replica's state
        keep it, or one of them writes it out for all; with none left, as after a loss."""
        if not source.keep:
            return source
        holders = [m for m in new if m.pid in source.keep]
        if not holders:
            return self.without_holders()
        if len(holders) < len(new) or not replicated(plan_for(len(new))):
            return StateSource(source.step, snapshot=[export_state(holders, new)])
        return StateSource(source.step, keep=frozenset(m.pid for m in holders))

    def without_holders(self) -> StateSource:
        """The state once no process holds it: the newer of the snapshot and the disk
        (fewer steps redone)."""
        disk = disk_source(latest_checkpoint(self.directory) or self.resume_from)
        if self.snapshot is not None and self.snapshot[0] >= disk.step:
            return self.from_snapshot()
        return disk

    def from_snapshot(self) -> StateSource:
        assert self.snapshot is not None
        step, parts = self.snapshot
        return StateSource(step, snapshot=[ray.put(part) for part in parts])
