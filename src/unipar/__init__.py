"""unipar: simple and automatic distributed machine learning on Ray.

Names load on first use, so ``import unipar.xgboost`` does not import torch.
"""

from __future__ import annotations

from unipar.lazy import lazy_exports

__version__ = "0.1.0"

_EXPORTS = {
    "CheckpointError": "unipar.errors",
    "ConfigError": "unipar.errors",
    "ResourceError": "unipar.errors",
    "TrainingFailedError": "unipar.errors",
    "TuningFailedError": "unipar.errors",
    "UniparError": "unipar.errors",
    "UnsupportedPlanError": "unipar.errors",
    "UserCodeError": "unipar.errors",
    "AdaptiveBatch": "unipar.adapt.config",
    "LRRule": "unipar.adapt.config",
    "Job": "unipar.job",
    "LRSchedule": "unipar.optimizer",
    "OptimizerKind": "unipar.optimizer",
    "OptimizerSpec": "unipar.optimizer",
    "ScheduleKind": "unipar.optimizer",
    "Mesh": "unipar.plan",
    "Plan": "unipar.plan",
    "Strategy": "unipar.plan",
    "plan_job": "unipar.plan.for_job",
    "Callback": "unipar.runtime",
    "FitResult": "unipar.runtime",
    "StepMetrics": "unipar.runtime",
    "fit": "unipar.runtime.run",
    "load_model_state": "unipar.runtime",
    "tune": "unipar.tuning.api",
    "submit": "unipar.service.client",
    "JobHandle": "unipar.service.client",
    "TuneResult": "unipar.tuning.api",
}


__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)


__all__ = sorted(_EXPORTS)
