"""Named strategies (``--strategy ddp|fsdp|tp|pp``): constraints on the one planner,
not separate code paths. ``auto`` pins nothing."""

from __future__ import annotations

from unipar.plan.representation import Strategy
from unipar.plan.strategy_search import Constraints


def constraints_for(strategy: Strategy, workers: int, *, runtime_only: bool = True) -> Constraints:
    """The planner's constraints for ``strategy`` on ``workers`` workers. Live planning
    (``runtime_only``, the default) proposes only plans the runtime applies today."""
    if strategy is Strategy.AUTO:
        return Constraints(runtime_only=runtime_only)
    axes = {"dp": 1, "fsdp": 1, "tp": 1, "pp": 1}
    axes[
        {Strategy.DDP: "dp", Strategy.FSDP: "fsdp", Strategy.TP: "tp", Strategy.PP: "pp"}[strategy]
    ] = workers
    return Constraints(**axes, cp=1, runtime_only=runtime_only)
