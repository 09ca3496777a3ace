"""unipar: simple and automatic distributed machine learning on Ray."""

from unipar.errors import (
    CheckpointError,
    ConfigError,
    ResourceError,
    TrainingFailedError,
    UniparError,
    UnsupportedPlanError,
    UserCodeError,
)
from unipar.job import Job, LRSchedule, OptimizerKind, OptimizerSpec, ScheduleKind
from unipar.plan import Mesh, Plan
from unipar.runtime import Callback, FitResult, StepMetrics, fit, load_model_state

__version__ = "0.1.0"

__all__ = [
    "Callback",
    "CheckpointError",
    "ConfigError",
    "FitResult",
    "Job",
    "LRSchedule",
    "Mesh",
    "OptimizerKind",
    "OptimizerSpec",
    "Plan",
    "ResourceError",
    "ScheduleKind",
    "StepMetrics",
    "TrainingFailedError",
    "UniparError",
    "UnsupportedPlanError",
    "UserCodeError",
    "fit",
    "load_model_state",
]
