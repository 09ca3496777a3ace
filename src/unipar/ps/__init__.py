"""Parameter servers on Ray: parameters sharded over server actors that run the
optimizer, workers that pull what their batch needs and push (sparse) gradients, under
BSP, SSP or ASP consistency. ``partition``, ``consistency``, ``optim`` and ``cost`` are
pure; ``server``, ``client`` and ``train`` run on Ray."""

from unipar.ps.consistency import Consistency, ConsistencySpec
from unipar.ps.cost import (
    Links,
    SparseWorkload,
    SyncChoice,
    SyncKind,
    choose_grad_sync,
    price_all_reduce,
    price_ps,
)
from unipar.ps.partition import Partitioning, RowSharding, TensorInfo, partition

__all__ = [
    "Consistency",
    "ConsistencySpec",
    "Links",
    "Partitioning",
    "RowSharding",
    "SparseWorkload",
    "SyncChoice",
    "SyncKind",
    "TensorInfo",
    "choose_grad_sync",
    "partition",
    "price_all_reduce",
    "price_ps",
]
