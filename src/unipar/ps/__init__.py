"""Parameter servers, their pure parts: parameters sharded over servers
(``partition``), BSP, SSP or ASP consistency (``consistency``), the update each server
runs on its shard (``optim``) and whether a model is worth serving (``worth``). The
servers' Ray side is :mod:`unipar.runtime.servers`; their price next to an all-reduce,
which the planner weighs, is :mod:`unipar.plan.sync_cost`."""

from unipar.ps.consistency import Consistency, ConsistencySpec
from unipar.ps.partition import Partitioning, RowSharding, TensorInfo, partition

__all__ = [
    "Consistency",
    "ConsistencySpec",
    "Partitioning",
    "RowSharding",
    "TensorInfo",
    "partition",
]
