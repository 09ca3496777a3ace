"""One job of the shared cluster: a Ray actor that runs ``fit`` under the scheduler's size.

The scheduler starts one detached, named runner per job on the head node; the runner's
thread runs :func:`unipar.fit` with an elastic worker range and a
:class:`~unipar.runtime.elastic.size_target.SizeTarget` the scheduler sets, and collects what
the scheduler reads each round (:mod:`unipar.service.ledger`): steps of batch M0 done,
workers, seconds per step at each size, resizes.
The training workers belong to the runner's process, so they outlive a scheduler that
dies (the runner is detached) and go with the runner when a job is cancelled.
"""

from __future__ import annotations

import os
import threading
import time
import traceback
from pathlib import Path
from typing import Any

import ray.cloudpickle

from unipar.runtime.callbacks import Callback
from unipar.runtime.elastic.size_target import SizeTarget
from unipar.runtime.run import fit
from unipar.service.ledger import RunnerStatus, StepLedger
from unipar.service.node_types import type_held


class JobRunner:
    """The Ray actor (see the module's docstring). ``job``: the pickled Job."""

    def __init__(self, job_id: int, job: bytes, options: dict[str, Any], run_dir: str,
                 log_path: str, target: int, decided: float, workers: tuple[int, int],
                 resources: dict[str, float] | None = None) -> None:
        """Starts training on ``workers`` (least, most), bounded by the size target, in a
        thread: a call to start it would be owned by the scheduler that made it, and lost
        with that scheduler's process if it died before the runner's process was up (the
        runner is detached; its creation outlives its creator). ``resources``: what each
        worker holds besides its CPU (its node type's, on a cluster of several)."""
        self.job_id = job_id
        self.job = ray.cloudpickle.loads(job)
        self.options = options
        self.run_dir, self.log_path = Path(run_dir), Path(log_path)
        self.target = SizeTarget(target, resources)
        self._decided = decided  # when the scheduler chose the target in force
        self.status_ = RunnerStatus()
        self._ledger = StepLedger(self.status_, self.job.global_batch_size)
        self._lock = threading.Lock()
        self._raised_at: float | None = None  # monotonic time the target rose past the gang
        self._thread = threading.Thread(target=self._run, args=(workers,), daemon=True)
        self._thread.start()

    def set_target(self, target: int, decided: float,
                   resources: dict[str, float] | None = None, batch: int = 0) -> None:
        """The scheduler's size (and the resources each worker holds: a change moves the
        gang; and an adaptive job's global batch, 0: its own choice), chosen at
        ``decided`` (unix seconds): the actor runs calls on several threads, so an older
        decision that arrives late is ignored."""
        with self._lock:
            if decided < self._decided:
                return
            self._decided = decided
            self.target.set(target, resources)
            self.target.set_batch(batch or None)
            if target <= self.status_.workers:
                self._raised_at = None
            elif self._raised_at is None:
                self._raised_at = time.monotonic()

    def status(self) -> RunnerStatus:
        with self._lock:
            return self.status_.copy()

    def pid(self) -> int:
        return os.getpid()

    # -- in the runner's thread -----------------------------------------------------------

    def _log(self, text: str) -> None:
        stamp = time.strftime("%H:%M:%S")
        with self.log_path.open("a") as log:
            log.write(f"{stamp} {text}\n")

    def _run(self, workers: tuple[int, int]) -> None:
        least, most = workers
        try:
            self._log(f"job {self.job_id} ({self.job.name}): {self.job.steps} steps on "
                      f"{least}..{most} workers, global batch {self.job.global_batch_size}")
            result = fit(self.job, workers=workers, run_dir=self.run_dir, progress=False,
                         size_target=self.target, callbacks=[_Reporter(self)], **self.options)
        except BaseException as error:  # the job's own failure: reported, not raised
            first = str(error).splitlines()[0] if str(error) else ""
            with self._lock:
                self.status_.state = "failed"
                self.status_.error = f"{type(error).__name__}: {first}"
            self._log("failed:\n" + "".join(traceback.format_exception(error)))
            return
        summary = result.summary()
        self._log(summary)
        with self._lock:
            self.status_.state, self.status_.summary = "done", summary
            # steps of batch M0: an adaptive job's progress reached its steps
            self.status_.step = self.job.steps if self.job.adaptive else len(result.history)

    def _on_step(self, metrics: Any, workers: list[Any]) -> None:
        size = len(workers)
        # the node type Ray placed its workers on, from what it assigned them
        gpu_type = type_held(workers[0].resources) if workers else ""
        with self._lock:
            self._ledger.step(metrics, size, gpu_type)
            done = self.status_.step
        if metrics.step % max(1, self.job.steps // 10) == 0:
            at = (f"step {metrics.step + 1} ({done}/{self.job.steps} steps of M0)"
                  if self.job.adaptive else f"step {done}/{self.job.steps}")
            where = f" of type {gpu_type}" if gpu_type else ""
            self._log(f"{at} loss {metrics.loss:.4f} on {size} workers{where}")

    def _on_resize(self, event: Any) -> None:
        with self._lock:
            self.status_.resizes.append(str(event))
            self._ledger.resized()
            if event.new > event.old and self._raised_at is not None:
                self.status_.grow_latency_s.append(time.monotonic() - self._raised_at)
                self._raised_at = None
        self._log(f"resize {event}")


class _Reporter(Callback):
    """Passes the controller's step and resize events to the runner."""

    def __init__(self, runner: JobRunner) -> None:
        self.runner = runner

    def on_step(self, metrics, workers):  # type: ignore[no-untyped-def]
        self.runner._on_step(metrics, workers)

    def on_resize(self, event):  # type: ignore[no-untyped-def]
        self.runner._on_resize(event)
