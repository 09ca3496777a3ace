"""The runtime: runs a plan on Ray workers with progress, checkpoints and recovery.

Names load on first use, so reading :mod:`unipar.runtime.config` (the command line
does, to check its flags before anything starts) imports neither torch nor Ray.
"""

import sys
import types

from unipar.lazy import lazy_exports

_EXPORTS = {
    "latest_checkpoint": "unipar.runtime.checkpoint",
    "load_model_state": "unipar.runtime.checkpoint",
    "Callback": "unipar.runtime.controller",
    "WorkerLost": "unipar.runtime.controller",
    "FitResult": "unipar.runtime.fit",
    "fit": "unipar.runtime.fit",
    "StepMetrics": "unipar.runtime.metrics",
    "read_metrics": "unipar.runtime.metrics",
}

__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)

__all__ = sorted(_EXPORTS)


class _Package(types.ModuleType):
    """Keeps ``unipar.runtime.fit`` the function: importing the submodule of the same
    name would otherwise bind the module over it."""

    def __setattr__(self, name: str, value: object) -> None:
        if name in _EXPORTS and isinstance(value, types.ModuleType):
            return
        super().__setattr__(name, value)


sys.modules[__name__].__class__ = _Package
