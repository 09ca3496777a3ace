"""Named strategies (``--strategy ddp|fsdp|tp|pp``): constraints on the one planner,
not separate code paths. ``auto`` pins nothing."""

from __future__ import annotations

from enum import Enum

from unipar.errors import ConfigError
from unipar.plan.strategy_search import Constraints


class Strategy(Enum):
    AUTO = "auto"
    DDP = "ddp"  # every worker a full replica, gradients all-reduced
    FSDP = "fsdp"  # every worker a shard of parameters, gradients and optimizer state
    TP = "tp"  # every layer split over all workers
    PP = "pp"  # the layers cut into one stage per worker

    @classmethod
    def parse(cls, value: str | Strategy) -> Strategy:
        if isinstance(value, Strategy):
            return value
        try:
            return cls(value.lower())
        except ValueError:
            choices = ", ".join(s.value for s in cls)
            raise ConfigError(
                f"strategy must be one of {choices} or a plan's JSON file, but got {value!r}"
            ) from None


def constraints_for(strategy: Strategy, workers: int) -> Constraints:
    """The planner's constraints for ``strategy`` on ``workers`` workers."""
    if strategy is Strategy.AUTO:
        return Constraints()
    axes = {"dp": 1, "fsdp": 1, "tp": 1, "pp": 1}
    axes[
        {Strategy.DDP: "dp", Strategy.FSDP: "fsdp", Strategy.TP: "tp", Strategy.PP: "pp"}[strategy]
    ] = workers
    return Constraints(**axes)
