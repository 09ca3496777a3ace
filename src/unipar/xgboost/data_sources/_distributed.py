"""Where the actors run, for giving them the partitions on their own node."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import ray


def get_actor_rank_ips(actors: Sequence[Any]) -> dict[int, str | None]:
    """Each actor's node IP by rank (None for a missing actor)."""
    refs = [actor.describe.remote() if actor is not None else None for actor in actors]
    return {rank: (ray.get(ref)[1] if ref is not None else None) for rank, ref in enumerate(refs)}
