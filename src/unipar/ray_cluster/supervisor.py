"""A gang of worker actors and what the cluster does to it: the generic supervisor.

Nothing here knows what the workers compute (no torch): it starts actors, follows
the streams of results they send, tells which actor's process is gone, how many more
actors the cluster has room for now, and which actors sit on a node that Ray is
draining (spot preemption, autoscaler scale-down, ``ray drain-node``). The torch
runtime's elastic controller and the XGBoost driver both drive it: an actor class only
needs a ``describe()`` method returning :func:`describe_process`.

Cluster state comes from Ray's GCS: free resources per node
(``ray._private.state.available_resources_per_node``) and draining nodes
(``GlobalState.get_draining_nodes``, set by the GCS ``DrainNode`` call that
autoscaler v2 and ``ray drain-node`` make).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import ray
from ray.exceptions import (
    ActorDiedError,
    ActorUnavailableError,
    GetTimeoutError,
    NodeDiedError,
    OutOfMemoryError,
    RayActorError,
    RayTaskError,
    WorkerCrashedError,
)

_START_POLL_S = 0.25  # how often a starting gang asks ``most`` while its members start up

PROCESS_LOST = (
    ActorDiedError,
    ActorUnavailableError,
    RayActorError,
    NodeDiedError,
    OutOfMemoryError,
    WorkerCrashedError,
)


def constructor_error(error: BaseException) -> str | None:
    """The last line of the exception an actor's constructor raised (the job could not be
    unpickled in its process, say), from Ray's error for the dead actor; ``None`` when
    the actor's process was lost otherwise."""
    text = str(error)
    if "creation task" not in text:
        return None
    return _last_line(text)


def _last_line(text: str) -> str:
    return [line for line in text.splitlines() if line.strip()][-1].strip()


def describe_process() -> tuple[int, str, str, dict[str, float]]:
    """(process id, node IP, Ray node id, the resources Ray assigned it) of the calling
    actor: its ``describe()``. The resources are what Ray reserved for this very process
    (``{"CPU": 1.0, "unipar_type_b": 1.0}``), not what it was asked for."""
    context = ray.get_runtime_context()
    assigned = {name: float(amount) for name, amount in context.get_assigned_resources().items()}
    return os.getpid(), ray.util.get_node_ip_address(), context.get_node_id(), assigned


@dataclass
class Member:
    """One actor of the gang, and where it runs."""

    actor: Any
    pid: int
    node_ip: str
    node_id: str
    resources: dict[str, float] = field(default_factory=dict)  # what Ray assigned it
    joined_at: float = field(default_factory=time.monotonic)

    def holds(self, resources: dict[str, float]) -> bool:
        """Whether Ray assigned this member at least ``resources`` (a node type's)."""
        return all(self.resources.get(name, 0.0) >= amount for name, amount in resources.items())


class Stream:
    """One member's call in flight: a plain result (an ObjectRef) or a Ray generator
    of items ending with the call's result. ``take_ready`` returns the items that have
    arrived and sets ``result`` when the call ends; it raises the worker's error, or one
    of :data:`PROCESS_LOST` when the member's process is gone."""

    def __init__(self, member: Member, handle: Any) -> None:
        self.member, self.handle = member, handle
        self.done = False
        self.result: object = None

    def take_ready(self, *, is_last: Callable[[object], bool]) -> list[object]:
        if isinstance(self.handle, ray.ObjectRef):
            if ray.wait([self.handle], timeout=0)[0]:
                self.result, self.done = ray.get(self.handle), True
            return []
        items: list[object] = []
        while not self.done and ray.wait([self.handle], timeout=0)[0]:
            ref = next(self.handle)
            item = ray.get(ref)
            if is_last(item):
                self.result, self.done = item, True
            else:
                items.append(item)
        return items


def describe_each(actors: Sequence[Any], timeout_s: float) -> list[Member | str]:
    """Members for ``actors`` once their constructors ran; for an actor that died (its
    constructor raised, its process was lost) or did not start within ``timeout_s``, why
    (it is killed)."""
    refs = [actor.describe.remote() for actor in actors]
    ray.wait(refs, num_returns=len(refs), timeout=timeout_s)
    members: list[Member | str] = []
    for actor, ref in zip(actors, refs, strict=True):
        try:
            members.append(Member(actor, *ray.get(ref, timeout=0)))
        except GetTimeoutError:
            ray.kill(actor, no_restart=True)
            members.append(f"it did not start within {timeout_s:.0f} s")
        except PROCESS_LOST as error:
            ray.kill(actor, no_restart=True)
            members.append(str(error))
    return members


def _collect_started(
    pending: list[tuple[Any, Any]], raised: list[str]
) -> tuple[list[Member], list[Any]]:
    """Of ``(actor, describe ref)`` pairs starting up: the members whose constructors
    have run, and the pairs still starting (the lost ones are killed and dropped; what a
    constructor raised is added to ``raised``)."""
    started, still = [], []
    for actor, ref in pending:
        if not ray.wait([ref], timeout=0)[0]:
            still.append((actor, ref))
            continue
        try:
            started.append(Member(actor, *ray.get(ref)))
        except PROCESS_LOST as error:
            ray.kill(actor, no_restart=True)
            if (line := constructor_error(error)) is not None:
                raised.append(line)
        except RayTaskError as error:  # its describe() raised: an early start's job
            ray.kill(actor, no_restart=True)
            raised.append(_last_line(str(error)))
    return started, still


class Supervisor:
    """Starts members of one kind and watches the cluster around them.

    ``make_actor()`` creates one actor (not yet started); ``needs`` are its resources
    (``{"CPU": 1}``), used to count how many more fit on the live, non-draining nodes.
    """

    def __init__(self, make_actor: Callable[[], Any], needs: dict[str, float]) -> None:
        self.make_actor = make_actor
        self.needs = {k: v for k, v in needs.items() if v}
        self.pending: list[tuple[Any, Any]] = []  # (actor, describe ref) starting up
        self.raised: list[str] = []  # what the constructors of members that died raised

    def start(
        self, count: int, timeout_s: float, most: Callable[[], int] | None = None
    ) -> list[Member]:
        """Start ``count`` members and wait for them (those that fail are left out).

        ``most``, asked while they start up: members past it are stopped at once, the
        newest first, so that the resources they hold go back to the cluster then and not
        after the whole gang has started (an outside size target lowered meanwhile)."""
        if most is None:
            most = lambda: count  # noqa: E731
        pending = [(actor, actor.describe.remote())
                   for actor in (self.make_actor() for _ in range(count))]
        members: list[Member] = []
        until = time.monotonic() + timeout_s
        while pending:
            keep = max(0, most() - len(members))  # pending ones still wanted
            for actor, _ in pending[keep:]:
                ray.kill(actor, no_restart=True)
            pending = pending[:keep]
            left = until - time.monotonic()
            if left <= 0:
                for actor, _ in pending:
                    ray.kill(actor, no_restart=True)
                break
            if pending:
                ray.wait([ref for _, ref in pending], num_returns=1,
                         timeout=min(left, _START_POLL_S))
            started, pending = _collect_started(pending, self.raised)
            members += started
        keep = max(0, min(len(members), most()))
        self.kill(members[keep:])
        return members[:keep]

    def start_in_background(self, count: int) -> None:
        """Start ``count`` members without waiting; :meth:`take_started` collects them."""
        for _ in range(count):
            actor = self.make_actor()
            self.pending.append((actor, actor.describe.remote()))

    def take_started(self) -> list[Member]:
        """Members started in the background whose constructors have run (lost ones
        are dropped)."""
        started, self.pending = _collect_started(self.pending, self.raised)
        return started

    def cancel_pending(self) -> None:
        for actor, _ in self.pending:
            ray.kill(actor, no_restart=True)
        self.pending = []

    def room(self) -> int:
        """How many more members the free resources of live, non-draining nodes hold."""
        draining = draining_nodes()
        free = ray._private.state.available_resources_per_node()
        total = 0
        for node_id, resources in free.items():
            if node_id in draining:
                continue
            total += min(
                (int(resources.get(name, 0.0) // each) for name, each in self.needs.items()),
                default=0,
            )
        return total

    @staticmethod
    def kill(members: Sequence[Member]) -> None:
        for member in members:
            ray.kill(member.actor, no_restart=True)


def draining_nodes() -> set[str]:
    """Hex ids of the nodes Ray is draining."""
    return set(ray._private.state.state.get_draining_nodes())


def on_draining_nodes(members: Sequence[Member]) -> list[Member]:
    """The members whose node Ray is draining."""
    draining = draining_nodes()
    return [member for member in members if member.node_id in draining] if draining else []
