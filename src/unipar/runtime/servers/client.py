"""The worker's side of the parameter servers: start the server actors, pull what a
batch needs (dense tensors, only the touched rows of each table), push gradients
(sparse rows for tables), and count the bytes moved."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import ray
import torch

from unipar.optimizer import OptimizerSpec
from unipar.ps.consistency import ConsistencySpec
from unipar.ps.partition import Partitioning
from unipar.runtime.servers.server import ParameterServer, Push


def start_servers(
    parts: Partitioning,
    initial: dict[str, torch.Tensor],
    *,
    optimizer: OptimizerSpec,
    consistency: ConsistencySpec,
    num_workers: int,
    snapshot_dir: str | None = None,
    snapshot_every: int = 0,
) -> list[Any]:
    """One threaded actor per server, restarted by Ray from its latest snapshot if its
    process dies (``max_restarts``); calls in flight then are retried on the new one."""
    actor = ray.remote(ParameterServer).options(
        num_cpus=0, max_concurrency=2 * num_workers + 4, max_restarts=4, max_task_retries=-1
    )
    servers = []
    for s in range(parts.num_servers):
        tensors = {name: initial[name] for name in parts.dense_on(s)}
        for table in parts.tables:
            local = torch.arange(parts.rows_on(table, s))
            tensors[table] = initial[table][parts.global_ids(table, s, local)]
        path = f"{snapshot_dir}/server{s}.pt" if snapshot_dir else None
        servers.append(
            actor.remote(
                s,
                tensors,
                set(parts.tables),
                optimizer,
                consistency,
                num_workers,
                path,
                snapshot_every,
            )
        )
    return servers


@dataclass
class Traffic:
    """Bytes this worker pulled and pushed."""

    pulled: int = 0
    pushed: int = 0
    per_step: list[int] = field(default_factory=list)
    pull_s: float = 0.0  # seconds spent in pulls, waiting for the consistency model included


def _nbytes(tensors: Any) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)


@dataclass(frozen=True)
class Pulled:
    """What a pull returned: dense tensors by name; per table, the unique global ids
    touched and their rows (in that order)."""

    dense: dict[str, torch.Tensor]
    ids: dict[str, torch.Tensor]
    rows: dict[str, torch.Tensor]


class PSClient:
    """Pushes are sent without waiting for the servers; the next pull first waits until
    they are in (``settle``), and every clock pulls before it pushes (a clock that reads
    nothing makes an empty pull), so a server always has a worker's clock ``c`` before
    its pull for ``c + 1``, and the push overlaps whatever the worker does in between."""

    def __init__(self, worker: int, parts: Partitioning, servers: list[Any]) -> None:
        self.worker = worker
        self.parts = parts
        self.servers = servers
        self.traffic = Traffic()
        self._pushes: list[Any] = []  # object refs of pushes not yet known to be in
        self.pulled_clock = 0  # the last clock this worker pulled for

    def settle(self) -> None:
        """Wait until every push sent has reached its server."""
        pushes, self._pushes = self._pushes, []
        ray.get(pushes)

    def pull(self, clock: int, ids: dict[str, torch.Tensor], dense: bool = True) -> Pulled:
        """Dense tensors (if ``dense``) and the rows of each table that ``ids`` touch."""
        began = time.perf_counter()
        self.settle()
        self.pulled_clock = clock
        unique = {t: torch.unique(i) for t, i in ids.items()}
        where = {t: self.parts.locate(t, u) for t, u in unique.items()}
        calls = []
        for s, server in enumerate(self.servers):
            rows = {t: local[srv == s] for t, (srv, local) in where.items()}
            names = self.parts.dense_on(s) if dense else []
            calls.append(server.pull.remote(self.worker, clock, names, rows))
        replies = ray.get(calls)
        out_dense: dict[str, torch.Tensor] = {}
        out_rows: dict[str, torch.Tensor] = {}
        for d, _ in replies:
            out_dense.update(d)
        for t, u in unique.items():
            srv = where[t][0]
            rows = torch.empty(len(u), self._dim(replies, t))
            for s, (_, r) in enumerate(replies):
                rows[srv == s] = r[t]
            out_rows[t] = rows
        self.traffic.pulled += _nbytes(out_dense.values()) + _nbytes(out_rows.values())
        self.traffic.pull_s += time.perf_counter() - began
        return Pulled(out_dense, unique, out_rows)

    @staticmethod
    def _dim(replies: list, table: str) -> int:
        return max(r[table].shape[1] for _, r in replies)

    def push(
        self,
        clock: int,
        dense: dict[str, torch.Tensor],
        rows: dict[str, tuple[torch.Tensor, torch.Tensor]],
    ) -> None:
        """Send the gradients of ``clock``: dense by name; per table (unique global ids,
        rows). Returns at once (see ``settle``); the clock must have pulled (which waited
        for the previous push)."""
        assert self.pulled_clock == clock, f"push of clock {clock} after no pull for it"
        where = {t: self.parts.locate(t, ids) for t, (ids, _) in rows.items()}
        for s, server in enumerate(self.servers):
            mine = {name: dense[name] for name in self.parts.dense_on(s) if name in dense}
            sparse = {
                t: (local[srv == s], rows[t][1][srv == s]) for t, (srv, local) in where.items()
            }
            self._pushes.append(server.push.remote(self.worker, clock, Push(mine, sparse)))
        pushed = _nbytes(dense.values()) + sum(
            _nbytes([g]) + _nbytes([i]) for i, g in rows.values()
        )
        self.traffic.pushed += pushed
