"""Plans: the unified representation of parallel strategies, the cost model and search.

The plan dataclasses load eagerly (every worker needs them); the planner (analysis,
cost model, search) loads on first use of ``plan``, ``search``, ``Constraints`` or
``PlanReport``.
"""

from typing import Any

from unipar.plan.representation import (
    GradSync,
    Mesh,
    PipelineSchedule,
    Plan,
    Recompute,
    TensorParallelStyle,
)

_PLANNER = {
    "plan": "unipar.plan.report",
    "PlanReport": "unipar.plan.report",
    "search": "unipar.plan.strategy_search",
    "Constraints": "unipar.plan.strategy_search",
}


def __getattr__(name: str) -> Any:
    if name in _PLANNER:
        import importlib

        return getattr(importlib.import_module(_PLANNER[name]), name)
    raise AttributeError(f"module 'unipar.plan' has no attribute {name!r}")


__all__ = [
    "Constraints",
    "GradSync",
    "Mesh",
    "PipelineSchedule",
    "Plan",
    "PlanReport",
    "Recompute",
    "TensorParallelStyle",
    "plan",
    "search",
]
