"""``RayParams``: how many actors train, with what resources and fault tolerance
(the names and meanings of XGBoost-Ray's ``RayParams``)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from unipar.errors import ConfigError


@dataclass(frozen=True)
class RayParams:
    """``max_actor_restarts``: how often failed actors are replaced (training resumes from
    the newest checkpoint; surviving actors keep their data). ``elastic_training``: go on
    with the remaining actors instead, as long as at most ``max_failed_actors`` are lost,
    and take replacements back once their data is loaded. ``checkpoint_frequency``:
    rounds between the in-memory checkpoints a restart resumes from."""

    num_actors: int = 0  # must be set: train() says so when it is 0
    cpus_per_actor: int = 0  # 0: all CPUs of the cluster divided over the actors
    gpus_per_actor: int = -1  # -1: 0 on a cluster without GPUs
    resources_per_actor: dict[str, float] | None = None
    elastic_training: bool = False
    max_failed_actors: int = 0
    max_actor_restarts: int = 0
    checkpoint_frequency: int = 5
    distributed_callbacks: Sequence[Any] | None = None
    placement_options: dict[str, Any] = field(default_factory=dict)
    verbose: bool | None = None

    def __post_init__(self) -> None:
        if self.num_actors < 0:
            raise ConfigError(f"num_actors must be >= 0, but got {self.num_actors}")
        if self.checkpoint_frequency < 1:
            raise ConfigError(
                f"checkpoint_frequency must be >= 1, but got {self.checkpoint_frequency}"
            )
        if self.elastic_training and self.max_failed_actors < 1:
            raise ConfigError(
                "elastic_training needs max_failed_actors >= 1 (how many actors may be lost), "
                f"but got max_failed_actors={self.max_failed_actors}"
            )
        if self.max_actor_restarts < 0 or self.max_failed_actors < 0:
            raise ConfigError(
                "max_actor_restarts and max_failed_actors must be >= 0, but got "
                f"{self.max_actor_restarts} and {self.max_failed_actors}"
            )
