"""Which rows, files or partitions each actor gets (pure: numpy only, no Ray).

- ``INTERLEAVED``: row (or file) ``i`` goes to actor ``i % n``;
- ``BATCH``: contiguous blocks, sized as ``numpy.array_split`` sizes them (the first
  ``len % n`` blocks one longer);
- ``FIXED``: partitions kept where a distributed source placed them (see
  :func:`assign_partitions`).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping, Sequence
from enum import Enum
from typing import Any

import numpy as np

from unipar.errors import ConfigError


class RayShardingMode(Enum):
    INTERLEAVED = 1  # row i goes to actor i % n
    BATCH = 2  # contiguous blocks
    FIXED = 3  # files or partitions as placed, one group per actor


def split_rows(rows: int, n: int, mode: RayShardingMode) -> list[slice]:
    """Each actor's rows as a slice (a view, never a copy of the data)."""
    if mode is RayShardingMode.INTERLEAVED:
        return [slice(i, rows, n) for i in range(n)]
    bounds = np.cumsum([0, *[len(p) for p in np.array_split(np.arange(rows), n)]])
    return [slice(int(a), int(b)) for a, b in itertools.pairwise(bounds)]


def split_items(items: Sequence[int], n: int, mode: RayShardingMode) -> list[list[int]]:
    """Each actor's files or partitions (by position); some are empty when there are
    fewer items than actors."""
    positions = range(len(items))
    return [[items[i] for i in positions[s]] for s in split_rows(len(items), n, mode)]


def _get_sharding_indices(
    sharding: RayShardingMode, rank: int, num_actors: int, n: int
) -> list[int]:
    """XGBoost-Ray's helper: the row (or file) positions of actor ``rank`` out of ``n``."""
    if sharding not in (RayShardingMode.INTERLEAVED, RayShardingMode.BATCH):
        raise ConfigError(
            f"sharding must be RayShardingMode.INTERLEAVED or BATCH to split rows, but got "
            f"{sharding}"
        )
    return list(range(n))[split_rows(n, num_actors, sharding)[rank]]


def split_at_queries(qid: np.ndarray, n: int) -> list[slice]:
    """Contiguous shards cut only where the query id changes, so that every query's rows
    stay on one actor (ranking objectives compare rows within a query)."""
    if np.any(np.diff(qid) < 0):
        raise ConfigError("rows must be sorted by qid for distributed ranking; sort them first")
    starts = np.flatnonzero(np.diff(qid)) + 1  # where a new query begins
    if len(starts) + 1 < n:
        raise ConfigError(f"{len(starts) + 1} queries cannot be split over {n} actors")
    # Each cut: the query start nearest its even share, after the previous cut and with
    # a start left for every later one (n shards, none empty, however uneven the queries).
    ideal = [round(len(qid) * k / n) for k in range(1, n)]
    cuts, low = [], 0
    for k, point in enumerate(ideal):
        high = len(starts) - (len(ideal) - k)
        i = low + int(np.abs(starts[low : high + 1] - point).argmin())
        cuts.append(int(starts[i]))
        low = i + 1
    bounds = [0, *cuts, len(qid)]
    return [slice(a, b) for a, b in itertools.pairwise(bounds)]


def assign_partitions(
    parts_by_node: Mapping[str, Sequence[Any]], node_of_actor: Mapping[int, str]
) -> dict[int, list[Any]]:
    """Partitions to actors, evenly and where possible on the actor's own node.

    Every actor gets ``floor(P/A)`` or ``ceil(P/A)`` of the ``P`` partitions (at most
    ``P % A`` actors the larger count). First, passes over the actors by rank each give
    the next partition of the actor's own node while it has room; then the partitions
    left (no room on their nodes' actors) go, in node order, to actors with room, by the
    same passes. Partition sizes are taken as equal (as XGBoost-Ray's assignment)."""
    left = {node: list(parts) for node, parts in parts_by_node.items()}
    total, actors = sum(len(p) for p in left.values()), len(node_of_actor)
    low, high = total // actors, max(1, math.ceil(total / actors))
    larger = total % actors  # how many actors may still take ``high`` partitions
    assigned: dict[int, list[Any]] = {rank: [] for rank in node_of_actor}

    def has_room(rank: int) -> bool:
        nonlocal larger
        count = len(assigned[rank])
        if count >= high:
            return False
        if count >= low:  # taking one more makes it one of the larger ones
            if larger <= 0:
                return False
            larger -= 1
        return True

    moved = True
    while moved:  # own node first
        moved = False
        for rank, node in node_of_actor.items():
            if left.get(node) and has_room(rank):
                assigned[rank].append(left[node].pop(0))
                moved = True
    rest = [part for parts in left.values() for part in parts]
    moved = True
    while rest and moved:  # then anywhere
        moved = False
        for rank in node_of_actor:
            if rest and has_room(rank):
                assigned[rank].append(rest.pop(0))
                moved = True
    if rest:
        raise ConfigError(f"{len(rest)} partitions found no actor with room; this is a bug")
    return assigned


def combine_data(sharding: RayShardingMode, data: Sequence[Any]) -> Any:
    """Put per-actor results back into one array in the original row order."""
    parts = [np.asarray(d) for d in data]
    if sharding is RayShardingMode.INTERLEAVED:
        total = sum(len(p) for p in parts)
        out = np.empty((total, *parts[0].shape[1:]), dtype=parts[0].dtype)
        for i, part in enumerate(parts):
            out[i :: len(parts)] = part
        return out
    return np.concatenate(parts)
