"""Data that implements ``__partitioned__`` (the DPPY partitioned protocol: a dict with
``shape``, ``partition_tiling``, ``partitions`` by position, each with its ``data``
(usually an ``ObjectRef``) and ``location`` (node IPs), and ``get`` to fetch them).

Partitions are cut by rows only; each goes whole to one actor, where possible on its own
node (:func:`unipar.xgboost.sharding.assign_partitions`)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from unipar.errors import ConfigError
from unipar.xgboost.data_sources._distributed import get_actor_rank_ips
from unipar.xgboost.sharding import assign_partitions


class Partitioned:
    supports_central_loading = True
    supports_distributed_loading = True

    @staticmethod
    def is_data_type(data: Any, filetype: Any = None) -> bool:
        return hasattr(data, "__partitioned__")

    @staticmethod
    def get_n(data: Any) -> int:
        """The rows of the whole."""
        return int(data.__partitioned__["shape"][0])

    @staticmethod
    def row_partitions(layout: dict[str, Any]) -> list[dict[str, Any]]:
        """The partitions in row order; only row-wise partitionings are taken."""
        tiling = tuple(layout["partition_tiling"])
        if not 1 <= len(tiling) <= 2 or any(t != 1 for t in tiling[1:]):
            raise ConfigError(
                f"partitioned data must be cut by rows only (partition_tiling (n,) or (n, 1)), "
                f"but got partition_tiling {tiling}; repartition it by rows"
            )
        suffix = (0,) * (len(tiling) - 1)
        return [layout["partitions"][(i, *suffix)] for i in range(tiling[0])]

    @staticmethod
    def positions_by_actor(layout: dict[str, Any], actors: Sequence[Any]) -> dict[int, list[int]]:
        """Each actor rank's partitions, by position in row order."""
        by_node: dict[str, list[int]] = {}
        for position, part in enumerate(Partitioned.row_partitions(layout)):
            by_node.setdefault(part["location"][0], []).append(position)
        return assign_partitions(by_node, get_actor_rank_ips(actors))

    @staticmethod
    def get_actor_shards(
        data: Any, actors: Sequence[Any]
    ) -> tuple[dict[str, Any], dict[int, list[Any]]]:
        """The layout, and each actor rank's partitions (their ``data``): balanced, and
        on the actor's node where possible."""
        layout = data.__partitioned__
        parts = Partitioned.row_partitions(layout)
        by_rank = Partitioned.positions_by_actor(layout, actors)
        return layout, {rank: [parts[i]["data"] for i in found] for rank, found in by_rank.items()}
