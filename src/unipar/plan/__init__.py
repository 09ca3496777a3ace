"""Plans: the unified representation of parallel strategies."""

from unipar.plan.plan import GradSync, Mesh, PipelineSchedule, Plan, Recompute

__all__ = ["GradSync", "Mesh", "PipelineSchedule", "Plan", "Recompute"]
