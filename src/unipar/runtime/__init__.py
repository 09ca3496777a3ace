"""The runtime: runs a plan on Ray workers with progress, checkpoints and recovery.

Names load on first use, so reading :mod:`unipar.runtime.config` (the command line
does, to check its flags before anything starts) imports neither torch nor Ray.
"""

from unipar.lazy import lazy_exports

_EXPORTS = {
    "latest_checkpoint": "unipar.runtime.checkpoint",
    "load_model_state": "unipar.runtime.checkpoint",
    "Callback": "unipar.runtime.callbacks",
    "WorkerLost": "unipar.runtime.callbacks",
    "FitResult": "unipar.runtime.run",
    "fit": "unipar.runtime.run",
    "StepMetrics": "unipar.runtime.metrics",
    "read_metrics": "unipar.runtime.metrics",
}

__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)

__all__ = sorted(_EXPORTS)
