"""Which server holds what. Pure.

Dense tensors go whole to one server each, largest first onto the least-loaded server
(the LPT rule, Graham 1969: within 4/3 of the best balance). Embedding tables are split
by rows over every server, by contiguous ranges or by hashing (row ``r`` to server
``r mod k``, as in Li et al., "Scaling Distributed Machine Learning with the Parameter
Server", OSDI 2014, which hashes keys to servers).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

import torch

from unipar.errors import ConfigError


class RowSharding(Enum):
    """How an embedding table's rows are split over the servers."""

    RANGE = "range"  # server i holds rows [start_i, end_i)
    HASH = "hash"  # server i holds rows r with r mod k == i


@dataclass(frozen=True)
class TensorInfo:
    """A parameter to place: its name, shape, and whether it is an embedding table
    (rows pulled and pushed sparsely) or a dense tensor (moved whole)."""

    name: str
    shape: tuple[int, ...]
    embedding: bool = False

    @property
    def numel(self) -> int:
        n = 1
        for d in self.shape:
            n *= d
        return n


@dataclass(frozen=True)
class Partitioning:
    """The placement of dense tensors (name -> server) and embedding tables (split
    over all ``num_servers`` by ``sharding``)."""

    num_servers: int
    dense: dict[str, int]
    tables: dict[str, int]  # table name -> number of rows
    sharding: RowSharding

    def dense_on(self, server: int) -> list[str]:
        return [name for name, s in self.dense.items() if s == server]

    def rows_on(self, table: str, server: int) -> int:
        """How many rows of ``table`` ``server`` holds."""
        rows, k = self.tables[table], self.num_servers
        if self.sharding is RowSharding.HASH:
            return (rows - server + k - 1) // k
        start, end = self.row_range(table, server)
        return end - start

    def row_range(self, table: str, server: int) -> tuple[int, int]:
        """Rows ``[start, end)`` of ``table`` on ``server`` under range sharding."""
        rows, k = self.tables[table], self.num_servers
        per, extra = divmod(rows, k)
        start = server * per + min(server, extra)
        return start, start + per + (1 if server < extra else 0)

    def locate(self, table: str, ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """For global row ``ids``: the server holding each and its local row there."""
        rows, k = self.tables[table], self.num_servers
        if self.sharding is RowSharding.HASH:
            return ids % k, ids // k
        per, extra = divmod(rows, k)
        big = extra * (per + 1)  # rows held by the first ``extra`` servers (one more each)
        server = torch.where(ids < big, ids // (per + 1), extra + (ids - big) // max(per, 1))
        start = server * per + torch.clamp(server, max=extra)
        return server, ids - start

    def global_ids(self, table: str, server: int, local: torch.Tensor) -> torch.Tensor:
        """The inverse of :meth:`locate` on one server."""
        if self.sharding is RowSharding.HASH:
            return local * self.num_servers + server
        return local + self.row_range(table, server)[0]


def partition(
    tensors: list[TensorInfo], num_servers: int, sharding: RowSharding = RowSharding.RANGE
) -> Partitioning:
    """Place ``tensors`` on ``num_servers`` servers (see the module docstring). Every
    server must get something: more servers than things to place is an error."""
    if num_servers < 1:
        raise ConfigError(f"num_servers must be at least 1, but got {num_servers}")
    dense = sorted((t for t in tensors if not t.embedding), key=lambda t: -t.numel)
    tables = {t.name: t.shape[0] for t in tensors if t.embedding}
    capacity = len(dense) + max(tables.values(), default=0)  # things that can each fill a server
    if num_servers > capacity:
        raise ConfigError(
            f"more servers than parameters to place: num_servers={num_servers}, but the "
            f"model has {len(dense)} dense tensor(s) and embedding tables of "
            f"{sorted(tables.values())} rows, so at most {capacity} servers hold anything; "
            f"use num_servers <= {max(capacity, 1)}"
        )
    load = [0] * num_servers
    for t in tables:
        for s in range(num_servers):
            load[s] += tables[t] // num_servers
    placed: dict[str, int] = {}
    for t in dense:
        server = min(range(num_servers), key=lambda s: (load[s], s))
        placed[t.name] = server
        load[server] += t.numel
    return Partitioning(num_servers, placed, tables, sharding)
