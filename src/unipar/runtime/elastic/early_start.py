"""Workers started before the driver loads the job: the first step sooner on a cluster
that ``unipar train`` joins.

A worker's start is its process's: Ray starts a fresh process for each actor, which
imports Ray's worker, torch, DCP and the trainer (about 2 s on a stock ``ray start``
cluster, measured by ``benchmarks/ddp_vs_torchrun.py``); the driver meanwhile loads the
job file, runs the preflight and imports the runtime. Done one after the other, the first
step waits for both. :class:`EarlyStart` asks for the gang's actors as soon as the driver
has joined the cluster and imported the worker's class, so the workers' processes start
while the driver goes on; the controller then hands each the job (:meth:`ElasticWorker.adopt
<unipar.runtime.elastic.worker.ElasticWorker.adopt>`) instead of starting new workers
(:class:`~unipar.runtime.elastic.controller.Controller`'s ``early``).

Only what the command line fixes before the job is loaded decides them: the number of
workers (``workers``, at most the room free now) and each one's CPUs and GPUs. A run that
ends before its gang forms (bad input) or runs on parameter servers (processes of their
own) kills them first (:meth:`EarlyStart.cancel`); they write nothing before they are
handed the job. Before the planner may time this machine's CPU (a calibration not cached
yet), the driver waits for their processes to have started (:meth:`EarlyStart.settle`),
so that their imports do not run beside the measurement.

(The driver's own loading runs in its main thread: importing torch from two threads at
once can hand one of them a partly initialised module, and the GIL would run the two
imports one after the other anyway.)
"""

from __future__ import annotations

from typing import Any

import ray

from unipar.runtime.config import RunConfig
from unipar.runtime.elastic.gang_workers import room_for_workers, worker_actor


class EarlyStart:
    """The actors of a gang, asked for now; :meth:`take` hands them over (their processes
    may still be starting), :meth:`cancel` kills those not taken."""

    def __init__(self, config: RunConfig) -> None:
        count = min(config.workers, room_for_workers(config))
        self._actors: list[Any] = [worker_actor(config, {}) for _ in range(count)]

    @property
    def actors(self) -> tuple[Any, ...]:
        """The actors not taken yet."""
        return tuple(self._actors)

    def settle(self, timeout_s: float) -> None:
        """Wait (up to ``timeout_s``) until the actors' processes have started: nothing
        else then runs beside what comes next (the CPU calibration times this machine).
        Actors that failed to start are left for the controller to find."""
        if self._actors:
            ray.wait([actor.describe.remote() for actor in self._actors],
                     num_returns=len(self._actors), timeout=timeout_s)

    def take(self) -> list[Any]:
        """The actors; from now on the caller kills them."""
        actors, self._actors = self._actors, []
        return actors

    def cancel(self) -> None:
        """Kill the actors not taken."""
        for actor in self._actors:
            ray.kill(actor, no_restart=True)
        self._actors = []
