"""The exceptions of XGBoost-Ray, by the same names."""

from __future__ import annotations

from unipar.errors import ConfigError, TrainingFailedError


class RayXGBoostTrainingError(TrainingFailedError, RuntimeError):
    """Training failed: an actor raised (the message names the actor and carries its
    traceback: ``actor_rank``, ``remote_traceback``), or actors died more often than the
    fault-tolerance settings allow. A ``RuntimeError``, as XGBoost-Ray's."""

    def __init__(
        self, message: str, actor_rank: int | None = None, remote_traceback: str = ""
    ) -> None:
        super().__init__(message)
        self.actor_rank = actor_rank
        self.remote_traceback = remote_traceback


class RayXGBoostTrainingStopped(RuntimeError):
    """Training was stopped on purpose (XGBoost-Ray's name; unipar stops actors by
    asking them to return after the current round, so it is not raised)."""


class RayXGBoostActorAvailable(RuntimeError):
    """Elastic training: a replacement actor is ready (XGBoost-Ray's name; unipar takes
    replacements back without an exception, so it is not raised)."""


class ShardingError(ConfigError, RuntimeError):
    """The data cannot be cut into a shard per actor (too few rows, files or
    partitions). A ``ConfigError``, and a ``RuntimeError`` as XGBoost-Ray raised it."""
