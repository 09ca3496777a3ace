"""Workers started before the driver loads the job: the first step sooner on a cluster
that ``unipar train`` joins.

A worker's start is its process's: Ray starts a fresh process for each actor, which
imports Ray's worker, torch, DCP and the trainer (about 2 s on a stock ``ray start``
cluster, measured by ``benchmarks/ddp_vs_torchrun.py``); the driver meanwhile loads the
job file, runs the preflight and imports the runtime. Done one after the other, the first
step waits for both. :class:`EarlyStart` asks for the gang's actors as soon as the driver
has joined the cluster and imported the worker's class (torch with it), so the workers'
processes start while the driver goes on; the controller then hands each the job
(:meth:`ElasticWorker.adopt <unipar.runtime.elastic.worker.ElasticWorker.adopt>`) instead
of starting new workers
(:class:`~unipar.runtime.elastic.controller.Controller`'s ``early``).

Only what the command line fixes before the job is loaded decides them: the number of
workers (``workers``, at most the room free now) and each one's CPUs and GPUs; a plan on
parameter servers (processes of its own) asks for none. A run that ends before its gang
forms (bad input), or whose planner picks parameter servers, kills them
(:meth:`EarlyStart.cancel`); they write nothing before they are handed the job. Before
the planner may time this machine's CPU (a calibration not cached yet), the driver waits
up to ``SETTLE_S`` for their processes to have started (:meth:`EarlyStart.settle`), so
that their imports do not run beside the measurement.

(The driver's own loading runs in its main thread: importing torch from two threads at
once can hand one of them a partly initialised module, and the GIL would run the two
imports one after the other anyway.)
"""

from __future__ import annotations

from typing import Any

import ray

from unipar.plan import GradSync, Plan
from unipar.runtime.config import RunConfig
from unipar.runtime.elastic.gang_workers import room_for_workers, worker_actor

SETTLE_S = 10.0  # the longest the planner waits for their processes (about 2 s each)


class EarlyStart:
    """The actors of a gang, asked for now (none for a plan on parameter servers, which
    starts processes of its own); the controller is handed :attr:`actors`, and
    :meth:`cancel` kills them all once the run has ended (those in the gang are killed by
    the controller too)."""

    def __init__(self, config: RunConfig) -> None:
        self._actors: list[Any] = []
        plan = config.plan
        if isinstance(plan, Plan) and plan.grad_sync is GradSync.PARAMETER_SERVER:
            return
        for _ in range(min(config.workers, room_for_workers(config))):
            self._actors.append(worker_actor(config, {}))  # kept one by one: cancel kills

    @property
    def actors(self) -> tuple[Any, ...]:
        return tuple(self._actors)

    def settle(self, timeout_s: float = SETTLE_S) -> None:
        """Wait (up to ``timeout_s``) until the actors' processes have started: nothing
        else then runs beside what comes next (the CPU calibration times this machine).
        Actors that failed to start are left for the controller to find."""
        if self._actors:
            ray.wait([actor.describe.remote() for actor in self._actors],
                     num_returns=len(self._actors), timeout=timeout_s)

    def cancel(self) -> None:
        """Kill the actors (killing one already dead does nothing)."""
        for actor in self._actors:
            ray.kill(actor, no_restart=True)
        self._actors = []
