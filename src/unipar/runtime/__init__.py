"""The runtime: runs a plan on Ray workers with progress, checkpoints and recovery."""

from unipar.runtime.checkpoint import latest_checkpoint, load_model_state
from unipar.runtime.controller import Callback, WorkerLost
from unipar.runtime.fit import FitResult, fit
from unipar.runtime.metrics import StepMetrics, read_metrics

__all__ = [
    "Callback",
    "FitResult",
    "StepMetrics",
    "WorkerLost",
    "fit",
    "latest_checkpoint",
    "load_model_state",
    "read_metrics",
]
