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
"""

from __future__ import annotations

import threading


class SizeTarget:
    """A thread-safe number of workers, set from one thread and read from another."""

    def __init__(self, workers: int | None = None) -> None:
        self._lock = threading.Lock()
        self._workers = workers

    def set(self, workers: int | None) -> None:
        with self._lock:
            self._workers = workers

    def __call__(self) -> int | None:
        with self._lock:
            return self._workers


def bounded(target: int | None, least: int, most: int) -> int:
    """``target`` within ``[least, most]`` (``most`` when there is none)."""
    return most if target is None else max(least, min(most, target))
