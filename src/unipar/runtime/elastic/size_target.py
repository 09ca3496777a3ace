"""An outside decision about how many workers an elastic job should have.

The elastic controller (:mod:`unipar.runtime.elastic.controller`) asks its size target at each
poll of its running gang (every ``poll_interval_s``, 0.5 s by default): above the
gang's size it grows up to the target when the cluster has room; below it, the workers
past the target leave at the next step boundary, the same way as from a draining node
(no step lost). A gang that starts under a target starts that many workers, waiting up
to ``placement_timeout_s`` for their room (a scheduler's target promises it, though a job
about to end may still hold it for a few seconds). ``None``: no outside decision, the
job's own ``workers`` range alone bounds it, and the gang starts on what fits. The
shared-cluster scheduler (:mod:`unipar.service`) sets one per job; any callable returning
``int | None`` works.

A :class:`SizeTarget` may also name resources each worker must hold (a node type's, e.g.
``{"unipar_type_b": 1.0}``: the mixed-cluster scheduler's choice of type), and, for a job
with an adaptive batch, the global batch to run (the scheduler's choice with the size,
Pollux §3): the controller passes it to the gang, which runs it from the next step
boundary instead of its own choices (:mod:`unipar.runtime.elastic.rendezvous`). New workers
ask Ray for them; when they change, the controller moves the gang: it starts workers that
hold the new ones while the gang trains on, then re-forms on them at a step boundary (the
old workers leave as from a draining node: no step lost), or, when the room for them is
not free within ``_JOINER_WAIT_S``, stops the old workers first and starts the new ones
in their room.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping


class SizeTarget:
    """A thread-safe number of workers, and the resources each holds besides its CPUs and
    GPUs, set from one thread and read from another."""

    def __init__(self, workers: int | None = None,
                 resources: Mapping[str, float] | None = None) -> None:
        self._lock = threading.Lock()
        self._workers = workers
        self._resources = dict(resources or {})
        self._batch: int | None = None

    def set_batch(self, batch: int | None) -> None:
        """The global batch an adaptive job runs (``None``: its own choice)."""
        with self._lock:
            self._batch = batch

    def batch(self) -> int | None:
        with self._lock:
            return self._batch

    def set(self, workers: int | None, resources: Mapping[str, float] | None = None) -> None:
        """``workers``, each holding ``resources`` (``None``: no such constraint)."""
        with self._lock:
            self._workers = workers
            self._resources = dict(resources or {})

    def __call__(self) -> int | None:
        with self._lock:
            return self._workers

    def resources(self) -> dict[str, float]:
        with self._lock:
            return dict(self._resources)


def bounded(target: int | None, least: int, most: int) -> int:
    """``target`` within ``[least, most]`` (``most`` when there is none)."""
    return most if target is None else max(least, min(most, target))
