"""Import xgboost in a training actor without its scikit-learn layer.

``import xgboost`` imports scikit-learn (and pandas) when they are installed, for its
estimator classes (``xgboost.compat``): 1.5 s of a 1.75 s import on 2 cores. Training
actors only use the core (``DMatrix``, ``train``, ``Booster``, ``collective``), so they
import xgboost with scikit-learn hidden; ``import sklearn`` works again right after, in
user callbacks too. Only xgboost's own estimator classes (``xgboost.XGBClassifier``) are
unusable in such a process; the driver, where they run, imports xgboost normally.
"""

from __future__ import annotations

import sys
from types import ModuleType


def import_xgboost_core() -> ModuleType:
    """``xgboost``, imported without scikit-learn unless either is imported already."""
    if "xgboost" in sys.modules or "sklearn" in sys.modules:
        import xgboost  # noqa: PLC0415 (heavy: xgboost)

        return xgboost
    sys.modules["sklearn"] = None  # type: ignore[assignment]  # makes `import sklearn` fail
    try:
        import xgboost  # noqa: PLC0415 (heavy: xgboost)
    finally:
        del sys.modules["sklearn"]
    return xgboost
