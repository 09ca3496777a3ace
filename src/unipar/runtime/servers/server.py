"""One parameter server: holds its shard of dense tensors and embedding rows, runs the
optimizer on them, orders reads and writes by the consistency model, and snapshots
itself. Run as a threaded Ray actor (see ``client.start_servers``): pulls wait on a
condition until the consistency model lets them read.

Clocks: a worker pushes the gradients of clock ``c`` and then pulls for ``c + 1``;
``done[w]`` is the last clock worker ``w`` finished. Under BSP/SSP the pushes of clock
``c`` are summed and applied, divided by the number of pushes, once every worker is
done with ``c`` (``applied = min(done)``). After a restore, clocks whose pushes were
all lost are skipped, a clock some of whose pushes came again (Ray retries calls in
flight) is applied with those (their mean), and a retried push of a clock the snapshot
holds is dropped: the applied clock is still ``min(done)``.
"""

from __future__ import annotations

import json
import os
import threading
from dataclasses import dataclass
from pathlib import Path

import torch

from unipar.optimizer import OptimizerSpec
from unipar.ps.consistency import ConsistencySpec, may_read
from unipar.ps.optim import ShardOptimizer

LEFT = 2**62  # the clock of a worker that has stopped: no clock waits for it


@dataclass(frozen=True)
class Push:
    """One worker's gradients for one server: dense tensors whole, tables as (local
    rows, gradient rows) with unique rows."""

    dense: dict[str, torch.Tensor]
    rows: dict[str, tuple[torch.Tensor, torch.Tensor]]


class ParameterServer:
    def __init__(
        self,
        index: int,
        tensors: dict[str, torch.Tensor],
        tables: set[str],
        optimizer: OptimizerSpec,
        consistency: ConsistencySpec,
        num_workers: int,
        snapshot_path: str | None = None,
        snapshot_every: int = 0,
    ) -> None:
        self.index = index
        self.tables = tables
        self.consistency = consistency
        self.num_workers = num_workers
        self.snapshot_path = snapshot_path
        self.snapshot_every = snapshot_every
        self.params = {name: t.clone() for name, t in tensors.items()}
        self.optimizer = ShardOptimizer(optimizer, self.params)
        self.done = [0] * num_workers
        self.applied = 0
        self.pending: dict[int, list[Push]] = {}
        self.restored_from: int | None = None
        self.snapshot_clock = 0
        self.cond = threading.Condition()
        if snapshot_path and os.path.exists(snapshot_path):
            self._restore(snapshot_path)
        elif snapshot_path and os.path.exists(self._left_path()):
            os.remove(self._left_path())  # an earlier run's, with no snapshot to go with

    # -- reads -------------------------------------------------------------------------
    def pull(
        self, worker: int, clock: int, dense: list[str], rows: dict[str, torch.Tensor]
    ) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
        """Parameters for ``worker`` about to compute ``clock``: the ``dense`` tensors
        named and the local ``rows`` of each table; waits as the consistency model says."""
        with self.cond:
            self._finish(worker, clock - 1)
            self.cond.wait_for(lambda: may_read(clock, self.applied, self.consistency))
            return (
                {name: self.params[name].clone() for name in dense},
                {name: self.params[name][r].clone() for name, r in rows.items()},
            )

    def state(self) -> dict[str, torch.Tensor]:
        with self.cond:
            return {name: t.clone() for name, t in self.params.items()}

    def status(self) -> dict:
        with self.cond:
            return {
                "pid": os.getpid(),
                "applied": self.applied,
                "restored_from": self.restored_from,
                "snapshot_clock": self.snapshot_clock,
            }

    # -- writes ------------------------------------------------------------------------
    def push(self, worker: int, clock: int, push: Push) -> None:
        with self.cond:
            if self.consistency.aggregates and clock <= self.applied:
                # a push Ray retried after a restore, of a clock the snapshot already
                # holds: applying it again (alone, at full weight) would count it twice
                self._finish(worker, clock)
            elif not self.consistency.aggregates:
                self._apply([push], scale=1.0 / self.num_workers)
                newest = clock > self.applied  # ASP: the newest clock any worker pushed
                self.applied = max(self.applied, clock)
                if newest:
                    self._maybe_snapshot()
                self._finish(worker, clock)
            else:
                self.pending.setdefault(clock, []).append(push)
                self._finish(worker, clock)
            self.cond.notify_all()

    def leave(self, worker: int) -> None:
        """``worker`` has stopped: no clock waits for it any more (kept beside the
        snapshot, so a restored server does not wait for it either)."""
        with self.cond:
            self._finish(worker, LEFT)
            if self.snapshot_path:
                left = [w for w, clock in enumerate(self.done) if clock == LEFT]
                tmp = Path(self._left_path() + ".tmp")
                tmp.write_text(json.dumps(left))
                os.replace(tmp, self._left_path())
            self.cond.notify_all()

    def _left_path(self) -> str:
        assert self.snapshot_path is not None
        return self.snapshot_path + ".left"

    def _finish(self, worker: int, clock: int) -> None:
        """Record that ``worker`` is done with ``clock``; apply every complete clock."""
        self.done[worker] = max(self.done[worker], clock)
        if not self.consistency.aggregates:
            return
        ready = min(self.done)
        for c in sorted(k for k in self.pending if k <= ready):
            pushes = self.pending.pop(c)
            self._apply(pushes, scale=1.0 / len(pushes))
        if ready > self.applied and ready < LEFT:
            self.applied = ready
            self._maybe_snapshot()
            self.cond.notify_all()

    def _apply(self, pushes: list[Push], scale: float) -> None:
        for name in pushes[0].dense:
            grad = sum(p.dense[name] for p in pushes) * scale
            self.optimizer.step(name, self.params[name], grad, None)
        for name in self.tables:
            parts = [p.rows[name] for p in pushes if name in p.rows]
            if not parts:  # no rows this step: the step count still advances (SparseAdam)
                self.optimizer.steps[name] += 1
                continue
            rows = torch.cat([r for r, _ in parts])
            grads = torch.cat([g for _, g in parts])
            unique, inverse = torch.unique(rows, return_inverse=True)
            summed = torch.zeros(len(unique), grads.shape[1], dtype=grads.dtype)
            summed.index_add_(0, inverse, grads)
            self.optimizer.step(name, self.params[name], summed * scale, unique)

    # -- snapshots ---------------------------------------------------------------------
    def _maybe_snapshot(self) -> None:
        if self.snapshot_path and self.snapshot_every and self.applied % self.snapshot_every == 0:
            self.snapshot()

    def snapshot(self) -> int:
        """Write params, optimizer state and the applied clock (atomically: a temp file
        renamed); returns the clock saved."""
        assert self.snapshot_path is not None
        tmp = Path(self.snapshot_path + ".tmp")
        torch.save(
            {
                "params": self.params,
                "optimizer": self.optimizer.state_dict(),
                "clock": self.applied,
            },
            tmp,
        )
        os.replace(tmp, self.snapshot_path)
        self.snapshot_clock = self.applied
        return self.applied

    def _restore(self, path: str) -> None:
        saved = torch.load(path, weights_only=True)
        self.params = saved["params"]
        self.optimizer.load_state_dict(saved["optimizer"])
        self.applied = self.snapshot_clock = self.restored_from = saved["clock"]
        self.done = [self.applied] * self.num_workers
        if os.path.exists(self._left_path()):
            for worker in json.loads(Path(self._left_path()).read_text()):
                self.done[worker] = LEFT
