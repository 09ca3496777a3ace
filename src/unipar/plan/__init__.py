"""Plans: the unified representation of parallel strategies, the cost model and search.

The plan dataclasses load eagerly (every worker needs them); the planner (analysis,
cost model, search) loads on first use of ``plan``, ``search``, ``Constraints`` or
``PlanReport``.
"""

from unipar.lazy import lazy_exports
from unipar.plan.representation import (
    GradSync,
    Mesh,
    MeshAxis,
    PipelineSchedule,
    Plan,
    Recompute,
    Strategy,
    TensorParallelStyle,
)

_PLANNER = {
    "plan": "unipar.plan.report",
    "PlanReport": "unipar.plan.report",
    "search": "unipar.plan.strategy_search",
    "Constraints": "unipar.plan.strategy_search",
    "plan_job": "unipar.plan.for_job",
}


__getattr__, __dir__ = lazy_exports(__name__, _PLANNER)


__all__ = [
    "Constraints",
    "GradSync",
    "Mesh",
    "MeshAxis",
    "PipelineSchedule",
    "Plan",
    "PlanReport",
    "Recompute",
    "Strategy",
    "TensorParallelStyle",
    "plan",
    "plan_job",
    "search",
]
