"""Where an elastic gang's workers run: the resources each must hold besides its CPUs and
GPUs (a node type's, such as ``{"unipar_type_b": 1.0}``), as the size target names them,
and the move of the gang when they change (:mod:`unipar.runtime.elastic.size_target`).

A move is made before it is broken: workers that hold the new resources start while the
gang trains on (Ray places each where the resources are), and the gang re-forms on them at
a step boundary, the old ones leaving as from a draining node, with the state of the
pause's snapshot (no step lost, the same samples: the same losses). Where the room for the
new workers is not free within ``wait_s`` (this very gang holds it, say), the old workers
leave first and the next gang starts in the room they free.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from unipar.ray_cluster.supervisor import Member, Supervisor


class WorkerPlacement:
    """The resources new workers ask for, kept up with ``wanted`` (the size target's)."""

    def __init__(self, wanted: Callable[[], dict[str, float]], base: dict[str, float],
                 wait_s: float) -> None:
        """``base``: a worker's CPUs and GPUs; ``wait_s``: how long new workers may take
        to be placed before the old ones leave first."""
        self.wanted, self.base, self.wait_s = wanted, base, wait_s
        self.placed = wanted()  # what the workers started from now on ask for
        self._started_at = 0.0

    @property
    def needs(self) -> dict[str, float]:
        """All a new worker asks of Ray."""
        return {**self.base, **self.placed}

    def changed(self) -> bool:
        return self.wanted() != self.placed

    def describe(self) -> str:
        return ", ".join(sorted(self.placed)) or "any node"

    def start(self, supervisor: Supervisor, count: int, timeout_s: float,
              most: Callable[[], int]) -> list[Member]:
        """``count`` members that hold the wanted resources (:meth:`Supervisor.start`, with
        ``most``); when those change while they start up (the room they wait for will not
        come), the ones started are stopped and the start begins again with the new ones."""
        while True:
            members = supervisor.start(count, timeout_s,
                                       most=lambda: 0 if self.changed() else most())
            if not self.changed():
                return members
            self.follow(supervisor, [])

    def follow(self, supervisor: Supervisor, joiners: list[Member]) -> None:
        """Once the wanted resources change, new workers ask for them, and those started
        before (pending or up, in ``joiners``) are stopped."""
        if not self.changed():
            return
        self.placed = self.wanted()
        supervisor.needs = self.needs
        supervisor.cancel_pending()
        stale = [m for m in joiners if not m.holds(self.placed)]
        supervisor.kill(stale)
        joiners[:] = [m for m in joiners if m not in stale]

    def misplaced(self, members: list[Member]) -> list[Member]:
        """The members that do not hold the wanted resources."""
        return [m for m in members if not m.holds(self.placed)]

    def replaced(self, supervisor: Supervisor, staying: int, joiners: list[Member],
                 most: int) -> bool:
        """Whether the misplaced members may leave now: workers that hold the wanted
        resources are up to take their places (added to ``joiners``; started here, in the
        background, up to ``most`` with the ``staying`` members), or the room for them was
        not free within ``wait_s`` (they are given up: the misplaced leave first, and the
        next gang's start waits for the room they free)."""
        joiners += supervisor.take_started()
        missing = max(0, most - staying) - len(joiners)
        if missing > 0 and not supervisor.pending:
            supervisor.start_in_background(missing)
            self._started_at = time.monotonic()
        if not supervisor.pending:
            return True
        if time.monotonic() - self._started_at <= self.wait_s:
            return False
        supervisor.cancel_pending()
        return True
