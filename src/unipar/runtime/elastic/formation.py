"""One formation of the elastic gang: where its state comes from, how it ended, the resize
event it records, and the waits on its members' calls (:mod:`unipar.runtime.elastic.controller`)."""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

import ray

from unipar.errors import UniparError
from unipar.ray_cluster.supervisor import PROCESS_LOST, Member, Stream
from unipar.runtime.checkpoint import read_checkpoint
from unipar.runtime.elastic.worker import Interrupted, Paused

SURVIVOR_GRACE_S = 30.0  # survivors still not done this long after a loss are given up
GRACE_S = 3.0  # after a failed step, how long to wait for Ray to report a lost peer


@dataclass(frozen=True)
class ResizeEvent:
    """The gang went from ``old`` to ``new`` workers before step ``step``."""

    step: int
    old: int
    new: int
    reason: str
    seconds: float  # from the event (loss seen, stop requested) to the new gang formed

    def __str__(self) -> str:
        return f"{self.old}\u2192{self.new} at step {self.step}: {self.reason}"


@dataclass(frozen=True)
class StateSource:
    """Where a new formation takes its state from."""

    step: int
    snapshot: list[ray.ObjectRef] | None = None
    resume_from: Path | None = None
    keep: frozenset[int] = frozenset()  # pids of survivors that hold the state already


class FormBroken(Exception):
    """Members were lost while a gang formed: the ``survivors`` form the next one."""

    def __init__(self, survivors: list[Member]) -> None:
        super().__init__("members lost while the gang formed")
        self.survivors = survivors


@dataclass
class FormationEnd:
    """How a formation ended."""

    streams: list[Stream]
    dead: list[Member]
    leaving: list[Member]
    joiners: list[Member]
    reason: str
    began: float  # when the event that ended it was seen


def gather_forms(
    forms: list[ray.ObjectRef], timeout_s: float
) -> tuple[dict[int, BaseException], ray.exceptions.RayTaskError | None]:
    """Wait for the members' ``form`` calls; the ranks whose processes were lost, and the
    first error a form raised. At the first loss or error it stops waiting; after an
    error, Ray is given a grace period to report a lost peer (the error may be the
    broken connection to it)."""
    lost: dict[int, BaseException] = {}
    failed: ray.exceptions.RayTaskError | None = None
    pending, until = list(forms), time.monotonic() + timeout_s
    while pending and not lost:
        left = until - time.monotonic() if failed is None else GRACE_S
        ready, pending = ray.wait(pending, num_returns=1, timeout=max(0.0, left))
        if not ready:
            break
        for ref in ready:
            try:
                ray.get(ref)
            except PROCESS_LOST as error:
                lost[forms.index(ref)] = error
            except ray.exceptions.RayTaskError as error:
                failed = failed or error
    return lost, failed


def export_state(holders: list[Member], new: list[Member]) -> ray.ObjectRef:
    """A replica's whole state, written out by one of ``holders`` for the ``new`` gang: by
    a member of it where one holds the state; else by one about to be stopped (a leaving
    member), waited for here, before it is stopped."""
    exporter = next((m for m in holders if m in new), holders[0])
    ref = exporter.actor.export_state.remote()
    if exporter not in new:
        ray.wait([ref], timeout=SURVIVOR_GRACE_S)
    return ref


def disk_source(path: Path | None) -> StateSource:
    """From the checkpoint at ``path`` (its step), or from scratch (``None``)."""
    return StateSource(max(0, checkpoint_step(path)), resume_from=path)


def checkpoint_step(path: Path | None) -> int:
    """The step of the checkpoint at ``path`` (-1: none, or not readable)."""
    if path is None:
        return -1
    try:
        return read_checkpoint(path).step
    except UniparError:
        return -1


def committed_steps(end: object) -> int:
    """Steps a survivor committed, from how its stream ended (-1: unknown)."""
    if isinstance(end, Interrupted):
        return end.committed
    if isinstance(end, Paused):
        return end.step
    return -1


def event_record(event: ResizeEvent) -> dict[str, object]:
    return {
        "step": event.step,
        "old": event.old,
        "new": event.new,
        "reason": event.reason,
        "seconds": round(event.seconds, 3),
    }
