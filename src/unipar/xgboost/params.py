"""``RayParams``: how many actors train, with what resources and fault tolerance
(the names and meanings of XGBoost-Ray 0.1.19's ``RayParams``)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from unipar.errors import ConfigError


@dataclass(frozen=True)
class RayParams:
    """``num_actors``: training actors; 0 (default): one per node of the cluster.
    ``cpus_per_actor``: 0 (default): all CPUs of the cluster divided over the actors, at
    most one node's (with the default actor count: all CPUs of a node).
    ``gpus_per_actor``: -1 (default): one GPU per actor when ``params`` train on GPU
    (``device="cuda"``, or a ``gpu_*`` tree method) and the cluster has GPUs, else 0.
    ``max_actor_restarts``: how often failed actors are replaced (training resumes from
    the newest checkpoint; surviving actors keep their data); -1: without limit.
    ``elastic_training``: go on with the remaining actors instead, as long as at most
    ``max_failed_actors`` are lost, and take replacements back once their data is loaded.
    ``checkpoint_frequency``: rounds between the in-memory checkpoints a restart resumes
    from. ``placement_options``: keyword arguments of the actors' placement group
    (``{"strategy": "SPREAD"}``). ``verbose``: log training progress (actors created,
    training started and finished, restarts) at INFO level on the driver, else at DEBUG;
    ``None``: verbose except inside a Ray Tune trial (XGBoost-Ray's rule)."""

    num_actors: int = 0
    cpus_per_actor: int = 0
    gpus_per_actor: int = -1
    resources_per_actor: dict[str, float] | None = None
    placement_options: dict[str, Any] | None = None
    elastic_training: bool = False
    max_failed_actors: int = 0
    max_actor_restarts: int = 0
    checkpoint_frequency: int = 5
    distributed_callbacks: Sequence[Any] | None = None
    verbose: bool | None = None

    def __post_init__(self) -> None:
        if self.num_actors < 0 or self.cpus_per_actor < 0 or self.gpus_per_actor < -1:
            raise ConfigError(
                "num_actors and cpus_per_actor must be >= 0 (0: follow the cluster) and "
                "gpus_per_actor >= -1 (-1: follow the cluster), but got "
                f"{self.num_actors}, {self.cpus_per_actor} and {self.gpus_per_actor}"
            )
        if self.checkpoint_frequency < 1:
            raise ConfigError(
                f"checkpoint_frequency must be >= 1, but got {self.checkpoint_frequency}"
            )
        if self.max_actor_restarts < -1 or self.max_failed_actors < 0:
            raise ConfigError(
                "max_actor_restarts must be >= -1 (-1: no limit) and max_failed_actors >= 0, "
                f"but got {self.max_actor_restarts} and {self.max_failed_actors}"
            )

    def check_fault_tolerance(self) -> None:
        """Elastic training needs ``max_failed_actors >= 1``; checked when training starts
        (XGBoost-Ray accepts the combination until then, e.g. to build the parameters of a
        Tune trial that refuses elastic training)."""
        if self.elastic_training and self.max_failed_actors < 1:
            raise ConfigError(
                "elastic_training needs max_failed_actors >= 1 (how many actors may be lost), "
                f"but got max_failed_actors={self.max_failed_actors}"
            )

    def get_tune_resources(self) -> Any:
        """The resources of a Ray Tune trial that trains with these parameters: a
        ``PlacementGroupFactory`` of an empty bundle for the trial itself and one bundle
        per actor (pass it to ``tune.with_resources``); ``train`` inside such a trial
        places its actors in those bundles."""
        if self.num_actors < 1 or self.cpus_per_actor < 1:
            raise ConfigError(
                "get_tune_resources needs explicit num_actors >= 1 and cpus_per_actor >= 1, "
                f"but got {self.num_actors} and {self.cpus_per_actor}"
            )
        from ray.tune import PlacementGroupFactory  # noqa: PLC0415 (heavy: Ray Tune)

        bundle: dict[str, float] = {"CPU": self.cpus_per_actor}
        if self.gpus_per_actor > 0:
            bundle["GPU"] = self.gpus_per_actor
        bundle.update(self.resources_per_actor or {})
        options = {"strategy": "PACK", **(self.placement_options or {})}
        return PlacementGroupFactory([{}, *[dict(bundle)] * self.num_actors], **options)
